//! Physical Region Page entries: how a transfer's memory is described to the controller.
//!
//! PRP1 points at the first byte (dword aligned, any offset in its page); the rest of the transfer
//! is whole pages. Up to two pages fit in PRP1/PRP2; a longer transfer puts a PRP list in PRP2. The
//! list lives in one preallocated page per command slot and is never chained, which caps one
//! command at `page_size / 8` pages after the first; the device splits longer transfers.

/// Why a transfer cannot be described.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum PrpError {
    #[error("the buffer address {iova:#x} is not dword aligned")]
    Unaligned { iova: u64 },
    #[error("a transfer of zero bytes")]
    Empty,
    #[error("{len} bytes need {pages} list entries but one PRP list page holds {capacity}")]
    TooLong {
        len: usize,
        pages: usize,
        capacity: usize,
    },
}

/// PRP1 and PRP2 of a command.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Prps {
    pub prp1: u64,
    pub prp2: u64,
}

/// Largest transfer one command can describe with a list of `page_size / 8` entries, for a buffer
/// starting on a page boundary.
pub fn max_transfer(page_size: usize) -> usize {
    page_size + page_size * (page_size / 8)
}

/// Describes `len` bytes at `iova`. When a list is needed it is written into `list`, whose device
/// address is `list_iova` (one page of the controller's page size).
pub fn build(
    iova: u64,
    len: usize,
    page_size: usize,
    list: &mut [u64],
    list_iova: u64,
) -> Result<Prps, PrpError> {
    if !iova.is_multiple_of(4) {
        return Err(PrpError::Unaligned { iova });
    }
    if len == 0 {
        return Err(PrpError::Empty);
    }
    let page = page_size as u64;
    let first = (page - iova % page) as usize;
    if len <= first {
        return Ok(Prps {
            prp1: iova,
            prp2: 0,
        });
    }
    let next = iova - iova % page + page;
    let rest = len - first;
    if rest <= page_size {
        return Ok(Prps {
            prp1: iova,
            prp2: next,
        });
    }
    let pages = rest.div_ceil(page_size);
    if pages > list.len() {
        return Err(PrpError::TooLong {
            len,
            pages,
            capacity: list.len(),
        });
    }
    for (i, entry) in list[..pages].iter_mut().enumerate() {
        *entry = next + i as u64 * page;
    }
    Ok(Prps {
        prp1: iova,
        prp2: list_iova,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const PAGE: usize = 4096;

    fn run(iova: u64, len: usize) -> (Result<Prps, PrpError>, Vec<u64>) {
        let mut list = vec![0u64; PAGE / 8];
        let r = build(iova, len, PAGE, &mut list, 0xAB_C000);
        (r, list)
    }

    #[test]
    fn one_page_uses_prp1_only() {
        let (r, _) = run(0x10_0000, 4096);
        assert_eq!(
            r,
            Ok(Prps {
                prp1: 0x10_0000,
                prp2: 0
            })
        );
        let (r, _) = run(0x10_0200, 512);
        assert_eq!(
            r,
            Ok(Prps {
                prp1: 0x10_0200,
                prp2: 0
            })
        );
    }

    #[test]
    fn two_pages_put_the_second_in_prp2() {
        let (r, _) = run(0x10_0000, 8192);
        assert_eq!(
            r,
            Ok(Prps {
                prp1: 0x10_0000,
                prp2: 0x10_1000
            })
        );
        // An offset start spills into the next page.
        let (r, _) = run(0x10_0800, 4096);
        assert_eq!(
            r,
            Ok(Prps {
                prp1: 0x10_0800,
                prp2: 0x10_1000
            })
        );
    }

    #[test]
    fn many_pages_use_a_list_of_the_following_pages() {
        let (r, list) = run(0x10_0000, 5 * 4096);
        assert_eq!(
            r,
            Ok(Prps {
                prp1: 0x10_0000,
                prp2: 0xAB_C000
            })
        );
        assert_eq!(&list[..4], &[0x10_1000, 0x10_2000, 0x10_3000, 0x10_4000]);
        assert_eq!(list[4], 0, "nothing written past the last page");
        // A partial last page still needs its entry.
        let (_, list) = run(0x10_0000, 2 * 4096 + 512);
        assert_eq!(&list[..2], &[0x10_1000, 0x10_2000]);
    }

    #[test]
    fn the_largest_transfer_fills_the_list_exactly() {
        let max = max_transfer(PAGE);
        assert_eq!(max, 4096 + 512 * 4096);
        let (r, list) = run(0x20_0000, max);
        assert!(r.is_ok());
        assert_eq!(list[511], 0x20_0000 + 512 * 4096);
        let (r, _) = run(0x20_0000, max + 4096);
        assert_eq!(
            r,
            Err(PrpError::TooLong {
                len: max + 4096,
                pages: 513,
                capacity: 512
            })
        );
    }

    #[test]
    fn unaligned_or_empty_transfers_are_refused() {
        assert_eq!(
            run(0x10_0002, 4096).0,
            Err(PrpError::Unaligned { iova: 0x10_0002 })
        );
        assert_eq!(run(0x10_0000, 0).0, Err(PrpError::Empty));
    }
}
