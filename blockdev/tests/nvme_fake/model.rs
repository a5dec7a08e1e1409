//! Random I/O checked against an in-memory model, by seed.

use super::*;

/// xorshift64*, seeded; NVMQ_SEED replays a run.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

#[test]
fn random_io_matches_a_model() {
    let seed: u64 = std::env::var("NVMQ_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0x5EED_0001);
    let result = std::panic::catch_unwind(|| random_run(seed));
    if result.is_err() {
        panic!("random_io_matches_a_model failed; replay with NVMQ_SEED={seed}");
    }
}

fn random_run(seed: u64) {
    let mut rng = Rng(seed | 1);
    let cfg = FakeConfig {
        mdts: 2,
        mqes: 63,
        blocks: 2048,
        lbads: 9,
        ..FakeConfig::default()
    };
    let (mut dev, h) = open_with(cfg, small_opts());
    let bs = 512usize;
    let blocks = 2048u64;
    let mut model = vec![0u8; blocks as usize * bs];
    let mut out = Vec::with_capacity(64);
    // Writes to disjoint ranges within one round, so completion order cannot matter.
    for round in 0..40u64 {
        let mut taken = vec![false; blocks as usize];
        let mut pending = HashMap::new();
        for i in 0..rng.below(dev.queue_depth() as u64) + 1 {
            let n = rng.below(200) + 1;
            let lba = rng.below(blocks - n);
            if (lba..lba + n).any(|b| taken[b as usize]) {
                continue;
            }
            (lba..lba + n).for_each(|b| taken[b as usize] = true);
            let tag = round * 1000 + i;
            let mut b = dev.alloc_buffer(n as usize * bs).unwrap();
            let fill = rng.next();
            for (k, x) in b.iter_mut().enumerate() {
                *x = (fill >> (k % 8 * 8)) as u8 ^ k as u8;
            }
            model[lba as usize * bs..(lba + n) as usize * bs].copy_from_slice(&b);
            dev.submit_write(tag, lba, b).unwrap();
            pending.insert(tag, lba);
        }
        while !pending.is_empty() {
            out.clear();
            dev.wait(&mut out, Duration::from_secs(1)).unwrap();
            for c in out.drain(..) {
                c.result.unwrap();
                assert_eq!(pending.remove(&c.tag), Some(c.lba));
            }
        }
    }
    assert_eq!(h.peek(0, model.len()), model);
    let back = dev.read_at(0, model.len()).unwrap();
    assert!(back == model, "read back differs from the model");
}
