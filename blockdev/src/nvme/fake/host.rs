//! The driver's side of the software controller: the [`Host`] seam (BAR0 registers, PCI config
//! space, DMA mappings) and the IOMMU's translation of the mapped IOVAs into memory.

use super::*;

impl State {
    /// A CPU pointer to `len` bytes at `iova`, if one mapping holds them all.
    pub(super) fn translate(&self, iova: u64, len: usize) -> Option<*mut u8> {
        self.maps.iter().find_map(|m| {
            let off = iova.checked_sub(m.iova)? as usize;
            (off.checked_add(len)? <= m.len).then(|| (m.vaddr + off) as *mut u8)
        })
    }

    pub(super) fn read_dma(&self, iova: u64, out: &mut [u8]) -> bool {
        let Some(p) = self.translate(iova, out.len()) else {
            return false;
        };
        // SAFETY: the driver mapped this memory with dma_map, whose contract keeps it allocated
        // until dma_unmap; translate checked the range lies inside one mapping.
        unsafe { std::ptr::copy_nonoverlapping(p, out.as_mut_ptr(), out.len()) };
        true
    }

    pub(super) fn write_dma(&self, iova: u64, data: &[u8]) -> bool {
        let Some(p) = self.translate(iova, data.len()) else {
            return false;
        };
        // SAFETY: as in read_dma.
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), p, data.len()) };
        true
    }
}

impl Host for FakeHost {
    fn name(&self) -> &str {
        &self.name
    }

    fn now(&self) -> std::time::Instant {
        lock(&self.state).stats.clock_reads += 1;
        std::time::Instant::now()
    }

    fn bar_len(&self) -> usize {
        self.bar_len
    }

    fn read32(&self, offset: usize) -> u32 {
        let s = lock(&self.state);
        let cap = u64::from(s.cfg.mqes)
            | 1 << 16
            | u64::from(s.cfg.timeout_units) << 24
            | u64::from(s.cfg.dstrd) << 32
            | 1 << 37
            | 4 << 52;
        match offset {
            regs::CAP => cap as u32,
            o if o == regs::CAP + 4 => (cap >> 32) as u32,
            regs::VS => 0x0001_0400,
            regs::CC => s.cc,
            regs::CSTS => s.csts,
            regs::AQA => s.aqa,
            _ => 0,
        }
    }

    fn write32(&self, offset: usize, value: u32) {
        if !self.timed {
            lock(&self.state).write_reg(offset, value);
            return;
        }
        let t = std::time::Instant::now();
        let mut s = lock(&self.state);
        s.write_reg(offset, value);
        s.stats.controller_ns += t.elapsed().as_nanos() as u64;
    }

    fn config_read16(&self, offset: u64) -> Result<u16, HostError> {
        Ok(if offset == 4 {
            lock(&self.state).pci_command
        } else {
            0
        })
    }

    fn config_write16(&self, offset: u64, value: u16) -> Result<(), HostError> {
        if offset == 4 {
            let mut s = lock(&self.state);
            s.pci_command = value;
            s.stats.bus_master = value & 1 << 2 != 0;
        }
        Ok(())
    }

    fn iova_ranges(&self) -> &[IovaRange] {
        &self.ranges
    }

    fn memlock(&self) -> Memlock {
        self.memlock
    }

    unsafe fn dma_map(&self, vaddr: *mut u8, len: usize, iova: u64) -> Result<(), HostError> {
        let mut s = lock(&self.state);
        let inside = s.cfg.iova_ranges.is_empty()
            || s.cfg
                .iova_ranges
                .iter()
                .any(|r| iova >= r.start && iova + len as u64 - 1 <= r.end);
        if std::mem::take(&mut s.fail_dma_map) || !inside {
            let errno = if inside { libc::ENOMEM } else { libc::EINVAL };
            return Err(HostError::DmaMap {
                iova,
                len,
                source: std::io::Error::from_raw_os_error(errno),
            });
        }
        s.maps.push(Map {
            iova,
            vaddr: vaddr as usize,
            len,
        });
        s.stats.dma_maps += 1;
        s.stats.mapped_bytes += len as u64;
        Ok(())
    }

    fn dma_unmap(&self, iova: u64, len: usize) -> Result<(), HostError> {
        let mut s = lock(&self.state);
        s.maps.retain(|m| !(m.iova == iova && m.len == len));
        Ok(())
    }
}
