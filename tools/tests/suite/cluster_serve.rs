//! Three `nvmq serve --node-id N --peers ...` processes on loopback, each on its own file
//! device, driven by a real Kafka client (Debian's kcat, librdkafka): records produced with
//! acks=all while the leader is SIGKILLed are all read back from the survivors, in order; the
//! killed node comes back, catches up, and then holds everything itself (it serves after
//! another node is killed); then the same with confluent-kafka as the producer. A leader cut off from the others (SIGSTOP) is replaced and rejoins
//! with their history. Throughout, the nodes compact the group's log (a snapshot of their
//! bookkeeping, then a purge) every few entries, never past what every node holds; a node
//! restarts from its snapshot. docs/cluster.md "Running a cluster", "Snapshots and compaction".

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::net::TcpListener;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::common::clients::{clients_dir, kcat, one_at_a_time, python, tmp, Server};
use crate::common::{metric, nvmq, try_scrape};

const TOPIC: &str = "replicated";
const PATIENCE: Duration = Duration::from_secs(60);
/// `--raft-compact-entries`: small, so that the tests' few hundred entries compact many times.
const COMPACT_EVERY: u64 = 4;
/// Entries a node's log may hold once idle: what has not reached the next compaction point,
/// the compaction entry itself, a new term's blank entry, and the entries behind a floor the
/// leader wrote before the last few applied.
const IDLE_ENTRIES: f64 = (3 * COMPACT_EVERY) as f64;

fn free_port() -> u16 {
    let l = TcpListener::bind("127.0.0.1:0").expect("binding a free port");
    l.local_addr().expect("its address").port()
}

struct Cluster {
    dir: std::path::PathBuf,
    kafka: BTreeMap<u64, String>,
    metrics: BTreeMap<u64, String>,
    peers: String,
    nodes: BTreeMap<u64, Server>,
}

impl Cluster {
    fn start(name: &str) -> Cluster {
        let dir = tmp(name);
        let mut kafka = BTreeMap::new();
        let mut metrics = BTreeMap::new();
        let mut peers = Vec::new();
        for id in 1..=3u64 {
            let k = format!("127.0.0.1:{}", free_port());
            peers.push(format!("{id}={k}/127.0.0.1:{}", free_port()));
            kafka.insert(id, k);
            metrics.insert(id, format!("127.0.0.1:{}", free_port()));
        }
        let mut c = Cluster {
            dir,
            kafka,
            metrics,
            peers: peers.join(","),
            nodes: BTreeMap::new(),
        };
        for id in 1..=3 {
            c.up(id);
        }
        c
    }

    /// Starts node `id` (again): the same device, the same addresses.
    fn up(&mut self, id: u64) {
        let device = format!("file:{}", self.dir.join(format!("n{id}.img")).display());
        let id_s = id.to_string();
        let every = COMPACT_EVERY.to_string();
        let s = Server::spawn(&[
            "--listen",
            &self.kafka[&id],
            "--device",
            &device,
            "--size",
            "128M",
            "--node-id",
            &id_s,
            "--peers",
            &self.peers,
            "--metrics-addr",
            &self.metrics[&id],
            "--raft-compact-entries",
            &every,
        ]);
        self.nodes.insert(id, s);
    }

    fn kill(&mut self, id: u64) {
        if let Some(s) = self.nodes.remove(&id) {
            s.sigkill();
        }
    }

    /// The bootstrap list of the nodes running.
    fn bootstrap(&self) -> String {
        let up: Vec<&str> = self
            .nodes
            .keys()
            .map(|id| self.kafka[id].as_str())
            .collect();
        up.join(",")
    }

    /// Writes one more record and reads everything back (every node has then applied what the
    /// leader had), stops the nodes cleanly, and checks that each device holds the partition
    /// with as many records as were read: whichever node led, all agree (a node that applied
    /// an entry twice, or skipped one, would not).
    fn stop_and_compare(mut self, acked: usize) {
        let mut p = produce(&self.bootstrap(), &records(acked..acked + 1));
        assert!(p.wait().expect("kcat").success());
        let last = self.read_all();
        check(&last, acked + 1);
        // Every node applied the partition up to the same end (its /metrics says so).
        let series = format!("partition_end_offset{{topic=\"{TOPIC}\",partition=\"0\"}}");
        let until = Instant::now() + PATIENCE;
        for id in [1, 2, 3] {
            loop {
                let body = try_scrape(&self.metrics[&id]).unwrap_or_default();
                let end = body
                    .contains(&series)
                    .then(|| metric(&body, &format!("nvmq_{series}")));
                if end == Some(last.len() as f64) {
                    break;
                }
                assert!(
                    Instant::now() < until,
                    "node {id}'s partition ends at {end:?}"
                );
                std::thread::sleep(Duration::from_millis(100));
            }
        }
        std::thread::sleep(Duration::from_millis(500));
        for id in [1, 2, 3] {
            if let Some(s) = self.nodes.remove(&id) {
                s.sigterm();
            }
            let n = next_offset_on(&self.dir.join(format!("n{id}.img")));
            assert_eq!(n, last.len() as u64, "node {id}'s device holds {n} records");
        }
    }

    /// A `nvmq_raft_*` gauge of node `id` (None while its /metrics does not answer).
    fn raft(&self, id: u64, name: &str) -> Option<f64> {
        let body = try_scrape(&self.metrics[&id]).ok()?;
        Some(metric(&body, &format!("nvmq_raft_{name}{{group=\"1\"}}")))
    }

    /// Waits until each of `ids` purged its log past `past` and holds at most [`IDLE_ENTRIES`]:
    /// the log stays bounded while records keep coming. Returns each node's purge point.
    fn compacted(&self, ids: &[u64], past: f64) -> BTreeMap<u64, f64> {
        let until = Instant::now() + PATIENCE;
        loop {
            let seen: BTreeMap<u64, (f64, f64)> = ids
                .iter()
                .map(|&id| {
                    let purged = self.raft(id, "purged_index").unwrap_or(-1.0);
                    let held = self.raft(id, "log_entries").unwrap_or(f64::MAX);
                    (id, (purged, held))
                })
                .collect();
            if seen.values().all(|&(p, h)| p > past && h <= IDLE_ENTRIES) {
                return seen.into_iter().map(|(id, (p, _))| (id, p)).collect();
            }
            assert!(
                Instant::now() < until,
                "the nodes did not compact past {past} (purged, entries held): {seen:?}"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Waits until the leader reports every node in sync (only the leader can tell).
    fn all_in_sync(&self) {
        let until = Instant::now() + PATIENCE;
        loop {
            let leader = self.leader();
            let out = kcat(&["-b", &self.kafka[&leader], "-L", "-t", TOPIC], b"");
            if out.contains("isrs: 1,2,3") {
                return;
            }
            assert!(Instant::now() < until, "not every node caught up: {out}");
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// The leader the running nodes name in Metadata (kcat -L), once one is named.
    fn leader(&self) -> u64 {
        self.leader_named_by(&self.bootstrap(), |_| true)
    }

    /// The running node the brokers of `bootstrap` name as leader, once they name one that
    /// `wanted` takes.
    fn leader_named_by(&self, bootstrap: &str, wanted: impl Fn(u64) -> bool) -> u64 {
        let until = Instant::now() + PATIENCE;
        loop {
            let out = Command::new("kcat")
                .args(["-b", bootstrap, "-L", "-m", "5"])
                .output()
                .expect("kcat -L");
            let text = String::from_utf8_lossy(&out.stdout);
            let named = text.lines().find_map(|l| {
                let l = l.trim();
                let rest = l.strip_prefix("broker ")?;
                l.ends_with("(controller)")
                    .then(|| rest.split(' ').next()?.parse::<u64>().ok())?
            });
            if let Some(id) = named.filter(|&id| self.nodes.contains_key(&id) && wanted(id)) {
                return id;
            }
            assert!(Instant::now() < until, "no leader named: {text}");
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Everything partition 0 holds, read by kcat through the running nodes (from the leader).
    fn read_all(&self) -> Vec<String> {
        // A follower that has not applied the topic's creation yet answers Metadata with
        // UNKNOWN_TOPIC_OR_PARTITION, as a Kafka broker whose metadata lags does, and kcat -C
        // gives up on that: ask again for a while.
        let until = Instant::now() + PATIENCE;
        let out = loop {
            let r = Command::new("kcat")
                .args([
                    "-C",
                    "-b",
                    &self.bootstrap(),
                    "-t",
                    TOPIC,
                    "-p",
                    "0",
                    "-o",
                    "beginning",
                ])
                .args(["-e", "-f", "%o %s\n"])
                .stdin(Stdio::null())
                .output()
                .expect("kcat");
            if r.status.success() {
                break String::from_utf8_lossy(&r.stdout).to_string();
            }
            assert!(Instant::now() < until, "kcat -C kept failing");
            std::thread::sleep(Duration::from_millis(200));
        };
        out.lines()
            .enumerate()
            .map(|(i, l)| {
                let (o, v) = l.split_once(' ').unwrap_or(("", l));
                assert_eq!(o, i.to_string(), "offsets are not contiguous at {l:?}");
                v.to_string()
            })
            .collect()
    }
}

fn records(range: std::ops::Range<usize>) -> String {
    range.map(|i| format!("r-{i}\n")).collect()
}

/// kcat's producer with acks=all and one request in flight (so that a retry after a failover
/// cannot reorder), retrying for up to 60 s; it exits 0 when every record was acknowledged.
fn produce(bootstrap: &str, input: &str) -> std::process::Child {
    produce_with(bootstrap, input, &[])
}

/// `produce` with more librdkafka settings (`key=value`).
fn produce_with(bootstrap: &str, input: &str, settings: &[&str]) -> std::process::Child {
    let mut child = Command::new("kcat")
        .args(["-P", "-b", bootstrap, "-t", TOPIC, "-p", "0"])
        .args(["-X", "acks=all", "-X", "max.in.flight=1"])
        .args(["-X", "message.timeout.ms=60000", "-X", "linger.ms=5"])
        .args(settings.iter().flat_map(|s| ["-X", s]))
        .stdin(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("starting kcat");
    let mut stdin = child.stdin.take().expect("kcat's stdin");
    stdin.write_all(input.as_bytes()).expect("feeding kcat");
    drop(stdin);
    child
}

/// The records as read hold every one of `acked` (r-0 .. r-(acked-1)) and nothing else, in
/// order. A run of records may appear twice in a row (a request that committed while its answer
/// was lost with the leader, sent again): the repeat must be the records just before it, in
/// order. Returns how many records were repeats.
fn check(read: &[String], acked: usize) -> usize {
    let mut next = 0usize;
    let mut replay: Option<usize> = None;
    let mut repeats = 0;
    for (offset, v) in read.iter().enumerate() {
        let i: usize = v
            .strip_prefix("r-")
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("offset {offset} holds {v:?}, which nobody produced"));
        assert!(
            i < acked,
            "offset {offset} holds r-{i}, past the {acked} produced"
        );
        if let Some(want) = replay {
            assert_eq!(i, want, "offset {offset}: a repeated run broke off");
        } else if i != next {
            assert!(
                i < next,
                "offset {offset} holds r-{i} before r-{next}: a record is missing or out of order"
            );
        }
        if i < next {
            repeats += 1;
            replay = (i + 1 < next).then_some(i + 1);
        } else {
            next += 1;
        }
    }
    assert_eq!(replay, None, "the partition ends inside a repeated run");
    assert_eq!(
        next,
        acked,
        "the survivors hold r-0 .. r-{} only",
        next.max(1) - 1
    );
    repeats
}

/// The partition's next offset on a stopped node's device (`nvmq inspect --json`).
fn next_offset_on(device: &std::path::Path) -> u64 {
    let out = Command::new(env!("CARGO_BIN_EXE_nvmq"))
        .args(["inspect", "--json", "--device"])
        .arg(format!("file:{}", device.display()))
        .output()
        .expect("nvmq inspect");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("inspect's JSON");
    v["partitions"]
        .as_array()
        .and_then(|ps| ps.iter().find(|p| p["topic"] == TOPIC && p["index"] == 0))
        .and_then(|p| p["next_offset"].as_u64())
        .unwrap_or_else(|| panic!("no {TOPIC}/0 on {}: {v}", device.display()))
}

#[test]
fn acknowledged_records_survive_the_leader_killed_and_the_node_comes_back_holding_them() {
    let _turn = one_at_a_time();
    python(); // kcat comes with the clients' setup
    let mut c = Cluster::start("cluster-serve");
    let first = c.leader();

    // 300 records acknowledged by a majority with every node up, in requests of at most 5
    // records with up to 20 in flight: the leader merges the requests that arrive while
    // earlier entries replicate into one entry, and the records stay in the order sent (no
    // request fails here, so librdkafka retries none).
    let mut p = produce_with(
        &c.bootstrap(),
        &records(0..300),
        &["batch.num.messages=5", "max.in.flight=20"],
    );
    assert!(
        p.wait().expect("kcat").success(),
        "producing to the cluster failed"
    );
    check(&c.read_all(), 300);
    let entries = c.raft(first, "proposed_entries_total").unwrap_or(0.0);
    let commands = c.raft(first, "proposed_commands_total").unwrap_or(0.0);
    println!("the leader wrote {commands} commands in {entries} entries");
    assert!(
        commands >= 60.0 && entries < commands,
        "300 records in requests of at most 5 are at least 60 commands, some merged: \
         {commands} commands in {entries} entries"
    );
    // Each node snapshotted and purged what all three hold.
    let purged = c.compacted(&[1, 2, 3], 0.0);
    println!("after 300 records, purged through {purged:?}");

    // 3000 more, while the leader is SIGKILLed mid-way: every record kcat got acknowledged is
    // on the two survivors.
    let mut p = produce(&c.bootstrap(), &records(300..3300));
    std::thread::sleep(Duration::from_millis(300));
    let killed_at = Instant::now();
    c.kill(first);
    let second = c.leader();
    let elected = killed_at.elapsed();
    assert_ne!(second, first);
    assert!(
        p.wait().expect("kcat").success(),
        "kcat gave up on records after the failover"
    );
    println!("leader {first} killed; node {second} named leader {elected:?} later");
    let read = c.read_all();
    check(&read, 3300);

    // The killed node comes back from its device, starting from its snapshot (its log was
    // purged, so there is nothing to replay before it), catches up, and has every record:
    // with another node killed, it is one of the two that serve.
    c.up(first);
    let snapshot = c.raft(first, "snapshot_index");
    let snapshot = snapshot.unwrap_or_else(|| panic!("node {first}'s /metrics is not up"));
    assert!(
        snapshot >= purged[&first],
        "node {first} restarted without the snapshot through {} it took: {snapshot}",
        purged[&first]
    );
    let mut p = produce(&c.bootstrap(), &records(3300..3400));
    assert!(
        p.wait().expect("kcat").success(),
        "producing after the restart failed"
    );
    let other = *c
        .nodes
        .keys()
        .find(|&&id| id != first && id != second)
        .expect("a third node");
    // The restarted node is in sync before the other is killed (then the two left hold
    // everything without a copy from the third).
    c.all_in_sync();
    c.kill(other);
    let after = c.read_all();
    let repeats = check(&after, 3400);
    assert_eq!(
        after[..read.len()],
        read[..],
        "the restarted node serves another history than the survivors did"
    );
    println!(
        "{} records read back, {repeats} of them repeats of a retried request",
        after.len()
    );

    // confluent-kafka (its own bundled librdkafka) producing while the leader is SIGKILLed
    // again: the same guarantees.
    c.up(other);
    c.all_in_sync();
    let leader = c.leader();
    let mut p = Command::new(python())
        .arg(clients_dir().join("scenarios.py"))
        .args([&c.bootstrap(), "produce_range", TOPIC, "3400", "4400"])
        .stdout(Stdio::piped())
        .spawn()
        .expect("starting confluent-kafka");
    // Killed once records are being acknowledged, 100 ms after the first.
    let mut lines = BufReader::new(p.stdout.take().expect("confluent-kafka's stdout")).lines();
    let first = lines.next().and_then(Result::ok).unwrap_or_default();
    assert_eq!(first, "first acknowledged", "confluent-kafka did not start");
    std::thread::sleep(Duration::from_millis(100));
    assert!(
        p.try_wait().expect("confluent-kafka's state").is_none(),
        "confluent-kafka was done before the leader was killed"
    );
    c.kill(leader);
    let said: Vec<String> = lines.map_while(Result::ok).collect();
    let said = said.join(" ");
    assert!(
        p.wait().expect("confluent-kafka").success(),
        "confluent-kafka: {said}"
    );
    println!("leader {leader} killed under confluent-kafka: {said}");
    check(&c.read_all(), 4400);

    // Each device holds the same partition, whichever node led; compaction went on through
    // the failovers.
    c.up(leader);
    c.all_in_sync();
    let later = c.compacted(&[1, 2, 3], purged.values().copied().fold(0.0, f64::max));
    println!("after the failovers, purged through {later:?}");
    c.stop_and_compare(4400);
}

/// A leader cut off from the others (frozen with SIGSTOP: its sockets stay open, it answers
/// nothing) is replaced; what clients sent it meanwhile is never acknowledged, and once it runs
/// again it steps down and ends with the others' history.
#[test]
fn a_leader_cut_off_from_the_others_is_replaced_and_rejoins_with_their_history() {
    let _turn = one_at_a_time();
    python();
    let c = Cluster::start("cluster-serve-cut-off");
    let first = c.leader();
    let mut p = produce_with(&c.bootstrap(), &records(0..100), &["batch.num.messages=10"]);
    assert!(
        p.wait().expect("kcat").success(),
        "producing to the cluster failed"
    );

    // Compacted and idle: what the node about to be cut off holds is its last index now.
    c.compacted(&[1, 2, 3], 0.0);
    std::thread::sleep(Duration::from_millis(500));
    let held = c.raft(first, "last_index").unwrap_or(-1.0);
    signal(&c.nodes[&first], "-STOP");
    let survivors: Vec<&str> = c
        .nodes
        .keys()
        .filter(|&&id| id != first)
        .map(|id| c.kafka[id].as_str())
        .collect();
    // Clients that still take the frozen node for the leader time out there and ask again.
    // Requests of at most 10 records: 50 entries or more, so the floor would move by many
    // compaction steps if the frozen node were left out of it.
    let mut p = produce_with(
        &survivors.join(","),
        &records(100..600),
        &["request.timeout.ms=2000", "batch.num.messages=10"],
    );
    // While the old leader is still frozen, the survivors name one of themselves.
    let second = c.leader_named_by(&survivors.join(","), |id| id != first);
    let ok = p.wait().expect("kcat").success();
    // `nvmq cluster status` through the survivors: the new leader sees the frozen node behind
    // by what was acknowledged meanwhile, silent, and out of sync (exit 6).
    let survivors = survivors.join(",");
    let frozen = status_of(&survivors, 6);
    println!("while node {first} is cut off: {frozen}");
    assert_eq!(frozen["leader"], second, "{frozen}");
    let v = voter(&frozen, first);
    assert_eq!(v["in_sync"], false, "{frozen}");
    assert!(v["entries_behind"].as_i64() >= Some(1), "{frozen}");
    // 500 records of 5 to 7 bytes, at least, in the batches it lacks.
    assert!(v["bytes_behind"].as_u64() >= Some(500 * 5), "{frozen}");
    // Frozen, it cannot catch up: asked again 300 ms later, it has been behind 300 ms longer,
    // and it has not answered (in this term, or for 300 ms more).
    let behind = |s: &serde_json::Value| voter(s, first)["behind_ms"].as_i64().unwrap_or(-1);
    let answered = |s: &serde_json::Value| voter(s, first)["last_answer_ms"].as_i64();
    std::thread::sleep(Duration::from_millis(300));
    let later = status_of(&survivors, 6);
    assert!(behind(&frozen) > 0, "{frozen}");
    assert!(behind(&later) >= behind(&frozen) + 300, "{frozen}\n{later}");
    match (answered(&frozen), answered(&later)) {
        (None, None) => {}
        (Some(a), Some(b)) => assert!(b >= a + 300, "{frozen}\n{later}"),
        _ => panic!("the frozen node answered: {frozen}\n{later}"),
    }
    for id in [1, 2, 3].into_iter().filter(|&id| id != first) {
        assert_eq!(voter(&frozen, id)["in_sync"], true, "{frozen}");
    }
    // Nobody purges what the frozen node lacks: whichever of them leads later, it can still be
    // sent those entries. Watched for 1.5 s, six of the compactor's looks: a floor that left the
    // frozen node out would have been written, snapshotted and purged by then (mutation
    // checked by hand: a floor of the applied index alone fails here).
    let until = Instant::now() + Duration::from_millis(1500);
    while Instant::now() < until {
        for id in [1, 2, 3].into_iter().filter(|&id| id != first) {
            let purged = c.raft(id, "purged_index").unwrap_or(f64::MAX);
            assert!(
                purged <= held,
                "node {id} purged through {purged}, past the frozen node's {held}"
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    signal(&c.nodes[&first], "-CONT");
    assert!(ok, "kcat gave up while the leader was cut off");
    println!("leader {first} cut off; node {second} leads");

    c.all_in_sync();
    // Asked of the node that was cut off (a follower now), the status comes from the leader:
    // every voter in sync, nothing behind (exit 0).
    let healed = status_of(&c.kafka[&first], 0);
    assert_eq!(healed["leader"], second, "{healed}");
    for id in [1, 2, 3] {
        let v = voter(&healed, id);
        assert_eq!(v["in_sync"], true, "{healed}");
        assert_eq!(v["bytes_behind"], 0, "{healed}");
    }
    let table = nvmq(&["cluster", "status", "--bootstrap", &c.kafka[&first]]);
    println!("{}", table.stdout);
    assert!(
        table.stdout.contains(&format!("leader node {second}")),
        "{}",
        table.stdout
    );
    let mut p = produce(&c.bootstrap(), &records(600..700));
    assert!(p.wait().expect("kcat").success());
    // Caught up, it lets every node compact past where it stood.
    c.compacted(&[1, 2, 3], held);
    c.stop_and_compare(700);
}

/// `nvmq cluster status --json` through `bootstrap`, which must exit with `code`.
fn status_of(bootstrap: &str, code: i32) -> serde_json::Value {
    let r = nvmq(&["cluster", "status", "--bootstrap", bootstrap, "--json"]);
    assert_eq!(r.code, code, "cluster status: {}{}", r.stdout, r.stderr);
    r.json()
}

/// Node `id`'s line of a status.
fn voter(status: &serde_json::Value, id: u64) -> &serde_json::Value {
    status["voters"]
        .as_array()
        .and_then(|vs| vs.iter().find(|v| v["node"] == id))
        .unwrap_or_else(|| panic!("no voter {id} in {status}"))
}

/// A broker started without --peers has no quorum: `nvmq cluster status` says so (exit 1)
/// rather than print an empty cluster.
#[test]
fn a_lone_broker_has_no_quorum_to_describe() {
    let s = Server::start("sim:capacity=64M");
    let r = nvmq(&["cluster", "status", "--bootstrap", &s.addr]);
    assert_eq!(r.code, 1, "{}{}", r.stdout, r.stderr);
    assert!(r.stderr.contains("runs alone"), "{}", r.stderr);
}

/// Sends `sig` (`-STOP`, `-CONT`) to a node's process.
fn signal(s: &Server, sig: &str) {
    let st = Command::new("kill")
        .args([sig, &s.child.id().to_string()])
        .status()
        .expect("kill");
    assert!(st.success(), "kill {sig} failed");
}
