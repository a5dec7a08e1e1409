//! Time: latencies, due-order delivery, the virtual clock that wait() drives, serialized flushes.

mod sim_support;

use std::time::{Duration, Instant};

use blockdev::sim::{Latency, Rng, SimClock, SimConfig, SimDevice};
use blockdev::BlockDevice;
use sim_support::*;

const US: u64 = 1000;

#[test]
fn sim_clock_api() {
    let v = SimClock::virtual_at_zero();
    assert!(v.is_virtual());
    let shared = v.clone();
    v.advance(Duration::from_micros(5));
    assert_eq!(shared.now_nanos(), 5 * US);
    shared.advance_to(3 * US); // never backwards
    assert_eq!(v.now_nanos(), 5 * US);
    v.advance(Duration::MAX);
    assert_eq!(v.now_nanos(), u64::MAX);

    let r = SimClock::real();
    assert!(!r.is_virtual());
    let t0 = r.now_nanos();
    r.advance(Duration::from_secs(100)); // no-op, no panic
    assert!(r.now_nanos() - t0 < 50_000_000_000);
}

#[test]
fn latency_samples() {
    let mut rng = Rng::new(1);
    assert_eq!(Latency::Zero.sample(&mut rng), 0);
    assert_eq!(
        Latency::Fixed(Duration::from_micros(7)).sample(&mut rng),
        7 * US
    );
    let u = Latency::Uniform {
        min: Duration::from_micros(30),
        max: Duration::from_micros(10),
    };
    for _ in 0..100 {
        let s = u.sample(&mut rng);
        assert!((10 * US..=30 * US).contains(&s), "{s}");
    }
}

#[test]
fn wait_advances_virtual_time_to_the_next_due_completion() {
    let mut cfg = virtual_cfg(1);
    cfg.write_latency = Latency::Fixed(Duration::from_micros(10));
    cfg.flush_latency = Latency::Fixed(Duration::from_micros(50));
    let (mut dev, h) = SimDevice::new(cfg);
    let clock = h.clock();
    submit_write(&mut dev, 1, 0, &pattern(1, 4096)); // due 10
    clock.advance(Duration::from_micros(3));
    submit_write(&mut dev, 2, 1, &pattern(2, 4096)); // due 13
    dev.submit_flush(3).unwrap(); // due 53 (covers nothing)
    let mut out = Vec::new();
    assert_eq!(dev.poll(&mut out).unwrap(), 0, "nothing due yet");
    assert_eq!(clock.now_nanos(), 3 * US);
    let mut seen = Vec::new();
    while dev.in_flight() > 0 {
        let n = dev.wait(&mut out, Duration::from_secs(1)).unwrap();
        assert_eq!(n, 1);
        seen.push((out.pop().unwrap().tag, clock.now_nanos()));
    }
    assert_eq!(seen, vec![(1, 10 * US), (2, 13 * US), (3, 53 * US)]);
}

#[test]
fn wait_with_virtual_clock_stops_at_the_timeout() {
    let mut cfg = virtual_cfg(2);
    cfg.write_latency = Latency::Fixed(Duration::from_millis(1));
    let (mut dev, h) = SimDevice::new(cfg);
    submit_write(&mut dev, 1, 0, &pattern(1, 4096));
    let mut out = Vec::new();
    let real = Instant::now();
    assert_eq!(dev.wait(&mut out, Duration::from_micros(100)).unwrap(), 0);
    assert_eq!(h.clock().now_nanos(), 100 * US);
    assert_eq!(dev.wait(&mut out, Duration::ZERO).unwrap(), 0);
    assert_eq!(dev.wait(&mut out, Duration::from_secs(3600)).unwrap(), 1);
    assert_eq!(h.clock().now_nanos(), 1000 * US);
    assert!(
        real.elapsed() < Duration::from_secs(1),
        "a virtual wait must not sleep"
    );
}

#[test]
fn uniform_latency_delivers_in_due_order_out_of_submission_order() {
    let mut reordered = false;
    for seed in 0..50 {
        let mut cfg = virtual_cfg(seed);
        cfg.write_latency = Latency::Uniform {
            min: Duration::from_micros(1),
            max: Duration::from_micros(100),
        };
        let (mut dev, h) = SimDevice::new(cfg);
        for t in 0..16 {
            submit_write(&mut dev, t, t, &pattern(t, 4096));
        }
        let mut last = 0;
        let mut tags = Vec::new();
        let mut out = Vec::new();
        while dev.in_flight() > 0 {
            dev.wait(&mut out, Duration::from_secs(1)).unwrap();
            let now = h.clock().now_nanos();
            assert!(now >= last, "seed {seed}: time went back");
            last = now;
            tags.extend(out.drain(..).map(|c| c.tag));
        }
        assert_eq!(tags.len(), 16, "seed {seed}");
        reordered |= tags.windows(2).any(|w| w[0] > w[1]);
    }
    assert!(reordered);
}

#[test]
fn serialized_flushes_queue_behind_each_other() {
    for serialize in [false, true] {
        let mut cfg = virtual_cfg(3);
        cfg.flush_latency = Latency::Fixed(Duration::from_micros(10));
        cfg.serialize_flushes = serialize;
        let (mut dev, h) = SimDevice::new(cfg);
        dev.submit_flush(1).unwrap();
        dev.submit_flush(2).unwrap();
        dev.submit_flush(3).unwrap();
        let mut times = Vec::new();
        let mut out = Vec::new();
        while dev.in_flight() > 0 {
            let n = dev.wait(&mut out, Duration::from_secs(1)).unwrap();
            times.extend(std::iter::repeat_n(h.clock().now_nanos(), n));
        }
        if serialize {
            assert_eq!(times, vec![10 * US, 20 * US, 30 * US]);
        } else {
            assert_eq!(times, vec![10 * US; 3]);
        }
    }
}

#[test]
fn real_clock_latency_is_served_by_sleeping() {
    let mut cfg = SimConfig::new(4, 1 << 20);
    cfg.write_latency = Latency::Fixed(Duration::from_micros(300));
    let (mut dev, _h) = SimDevice::new(cfg);
    let start = Instant::now();
    submit_write(&mut dev, 1, 0, &pattern(1, 4096));
    let mut out = Vec::new();
    dev.poll(&mut out).unwrap();
    if out.is_empty() {
        let n = dev.wait(&mut out, Duration::from_secs(5)).unwrap();
        assert_eq!(n, 1);
    }
    assert!(start.elapsed() >= Duration::from_micros(300));
    // A short timeout returns with nothing.
    submit_write(&mut dev, 2, 0, &pattern(2, 4096));
    let mut cfg2 = SimConfig::new(4, 1 << 20);
    cfg2.write_latency = Latency::Fixed(Duration::from_secs(10));
    let (mut slow, _h2) = SimDevice::new(cfg2);
    submit_write(&mut slow, 1, 0, &pattern(1, 4096));
    let t = Instant::now();
    assert_eq!(slow.wait(&mut out, Duration::from_millis(5)).unwrap(), 0);
    assert!(t.elapsed() < Duration::from_secs(2));
}
