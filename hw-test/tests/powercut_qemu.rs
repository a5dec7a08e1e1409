//! CI mode 2 of the power-cut rig: `nvmq serve` runs in a QEMU guest on the emulated NVMe through
//! our VFIO driver; the namespace is backed by nvmq's NBD server, whose volatile cache a cut tears
//! by the crash model. The controller (the same code `nvmq-rig` runs) drives acks=all load from the
//! host through a forwarded port; a cut SIGKILLs QEMU at the moment the controller picks (so the
//! guest flushes nothing), then cuts the NBD server's power; the restore boots a new guest on the
//! same export, whose broker recovers. Every acknowledged record must read back afterwards.
//!
//! NVMQ_QEMU_CUTS sets the number of cycles (8 by default: CI's time; long runs ask for more), NVMQ_RIG_SEED the seed (printed).

mod common;

use std::path::PathBuf;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use hw_test::powercut::{self, PowerSwitch, RigError as PowercutError, RigOptions as Load};
use hw_test::qemu::{
    free_local_port, Disk, GuestCmd, KillSwitch, KilledRun, NbdServer, PortForward, Rig, RigOptions,
};

const GUEST_PORT: u16 = 9092;
const DISK_BYTES: u64 = 512 << 20;

/// The guest's power: a running QEMU, its kill switch, and the NBD server behind its NVMe.
struct QemuSwitch {
    rig: Arc<Rig>,
    nbd: NbdServer,
    nvmq: PathBuf,
    host_port: u16,
    running: Option<(KillSwitch, JoinHandle<Result<KilledRun, String>>)>,
    boots: u32,
    next_cut_seed: u64,
    last: Option<String>,
}

impl QemuSwitch {
    /// The broker's commands for one boot: the first formats the namespace.
    fn commands(&self) -> Vec<GuestCmd> {
        let nvme = "nvme:{pci}";
        let mut cmds = Vec::new();
        if self.boots == 0 {
            cmds.push(GuestCmd::host(
                &self.nvmq,
                ["format", "--device", nvme, "--json"],
            ));
        }
        let advertise = format!("127.0.0.1:{}", self.host_port);
        let listen = format!("0.0.0.0:{GUEST_PORT}");
        cmds.push(GuestCmd::host(
            &self.nvmq,
            [
                "serve",
                "--device",
                nvme,
                "--listen",
                listen.as_str(),
                // The guest's port is reached only through QEMU's user network from the host.
                "--insecure-network",
                "--advertise",
                advertise.as_str(),
            ],
        ));
        cmds
    }

    fn boot(&mut self) {
        let cmds = self.commands();
        let rig = self.rig.clone();
        let switch = KillSwitch::new();
        let k = switch.clone();
        let handle = std::thread::spawn(move || {
            rig.run_until_killed(&cmds, None, Some(&k))
                .map_err(|e| e.to_string())
        });
        self.boots += 1;
        self.running = Some((switch, handle));
    }
}

fn failed(what: &str, detail: String) -> PowercutError {
    PowercutError::InProcess(format!("{what}: {detail}"))
}

impl PowerSwitch for QemuSwitch {
    fn cut(&mut self) -> Result<(), PowercutError> {
        let (switch, handle) = self
            .running
            .take()
            .ok_or_else(|| failed("cut", "no guest is running".into()))?;
        switch.pull();
        let run = handle
            .join()
            .map_err(|_| failed("cut", "the boot thread panicked".into()))?
            .map_err(|e| failed("the guest ended before the cut", e))?;
        // Only now, with QEMU dead, the drive loses its volatile cache.
        let seed = self.next_cut_seed;
        self.next_cut_seed += 1;
        let outcome = self
            .nbd
            .cut(seed)
            .map_err(|e| failed("NBD power cut", e.to_string()))?;
        let recovered = run
            .commands
            .iter()
            .flat_map(|c| c.output.lines())
            .find(|l| l.starts_with("recovered from"))
            .unwrap_or("(no recovery line)")
            .to_string();
        self.last = Some(format!(
            "boot {} killed after {:.1?}; its open: {recovered}; NBD cut: {outcome}",
            self.boots, run.killed_after
        ));
        Ok(())
    }

    fn restore(&mut self) -> Result<(), PowercutError> {
        self.boot();
        Ok(())
    }

    fn recovery_report(&mut self) -> Option<String> {
        self.last.clone()
    }
}

#[test]
fn power_cuts_of_the_guests_nvme_lose_no_acknowledged_record() {
    let seed: u64 = std::env::var("NVMQ_RIG_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(20261130);
    let cycles: u32 = std::env::var("NVMQ_QEMU_CUTS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(8);
    common::log(format!(
        "QEMU power-cut rig: seed {seed}, {cycles} cycles (replay: NVMQ_RIG_SEED={seed})"
    ));
    let _guard = common::ONE_GUEST.lock().unwrap_or_else(|p| p.into_inner());
    let nvmq = common::nvmq_binary();
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("powercut-qemu-{seed}"));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("work dir");
    let image = dir.join("nvme.img");
    std::fs::File::create(&image)
        .and_then(|f| f.set_len(DISK_BYTES))
        .expect("NBD image");
    // Flushes as slow as a laptop SSD's: most cut moments then find batches written but not yet
    // durable, so the cuts really tear the drive's cache.
    let nbd =
        NbdServer::start_power_cut_with(&image, &dir.join("nbd.sock"), Duration::from_millis(4))
            .unwrap_or_else(|e| panic!("NBD server: {e}"));
    let host_port = free_local_port().expect("a free port");
    let rig = Rig::new(RigOptions {
        disk: Disk::Nbd {
            socket: nbd.socket().to_path_buf(),
        },
        logical_block_size: 4096,
        physical_block_size: 4096,
        forwards: vec![PortForward {
            host: host_port,
            guest: GUEST_PORT,
        }],
        // A boot lasts a whole cycle: load, cut, and the wait for the next one.
        timeout: Duration::from_secs(900),
        ..RigOptions::default()
    })
    .unwrap_or_else(|e| panic!("QEMU rig cannot start: {e}"));
    let mut switch = QemuSwitch {
        rig: Arc::new(rig),
        nbd,
        nvmq,
        host_port,
        running: None,
        boots: 0,
        next_cut_seed: seed,
        last: None,
    };
    switch.boot();

    let mut o = Load::new(
        format!("127.0.0.1:{host_port}"),
        "qemu-rig",
        dir.join("acks.ledger"),
    );
    o.seed = seed;
    o.cycles = cycles;
    o.producers = 2;
    o.partitions = 2;
    o.cut_after = (Duration::from_millis(300), Duration::from_millis(1500));
    o.body_len = (16, 512);
    o.up_timeout = Duration::from_secs(240);
    o.request_timeout = Duration::from_secs(30);
    o.poll_interval = Duration::from_millis(100);
    let report = powercut::run(&o, &mut switch, |c| common::log(format!("{c}")))
        .unwrap_or_else(|e| panic!("seed {seed}: the rig could not run: {e}"));
    common::log(format!("{report}"));
    if let Some((k, h)) = switch.running.take() {
        k.pull();
        let _ = h.join();
    }
    let t = &report.totals;
    assert_eq!(t.cycles, cycles, "seed {seed}");
    assert_eq!(t.lost_acked, 0, "seed {seed}: acknowledged records lost");
    assert_eq!(
        t.checksum_failures, 0,
        "seed {seed}: served records failed their checksum"
    );
    assert!(t.acked > 0, "seed {seed}: nothing was acknowledged");
    assert!(report.passed(), "seed {seed}: {report}");
    // The NBD server wakes its accept loop through its socket: stop it before the socket goes.
    drop(switch);
    let _ = std::fs::remove_dir_all(&dir);
}
