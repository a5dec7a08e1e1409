//! The classic consumer-group coordinator (JoinGroup / SyncGroup / Heartbeat / LeaveGroup):
//! Empty → PreparingRebalance → CompletingRebalance → Stable. Join answers are held until every
//! known member has rejoined or the rebalance timeout removed the rest; SyncGroup answers wait for
//! the leader's assignment. Generations are recorded in `__nvmq_meta` so that they keep rising
//! across restarts; members are not: after a restart every member rejoins (UNKNOWN_MEMBER_ID).

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use bytes::Bytes;
use tokio::sync::{mpsc, oneshot};

use crate::broker::lock;
use crate::codes;

const MIN_SESSION_TIMEOUT: i32 = 1_000;
const MAX_SESSION_TIMEOUT: i32 = 3_600_000;

pub struct JoinRequest {
    pub group: String,
    pub member_id: String,
    pub client_id: String,
    pub session_timeout_ms: i32,
    pub rebalance_timeout_ms: i32,
    pub protocol_type: String,
    pub protocols: Vec<(String, Bytes)>,
}

#[derive(Debug, Clone, Default)]
pub struct JoinResult {
    pub error: i16,
    pub generation: i32,
    pub protocol_type: Option<String>,
    pub protocol: Option<String>,
    pub leader: String,
    pub member_id: String,
    /// Every member's metadata for the chosen protocol: only for the leader.
    pub members: Vec<(String, Bytes)>,
}

#[derive(Debug, Clone, Default)]
pub struct SyncResult {
    pub error: i16,
    pub protocol_type: Option<String>,
    pub protocol: Option<String>,
    pub assignment: Bytes,
}

/// A coordinator answer: at once, or held until the group moves on.
pub enum Answer<T> {
    Now(T),
    Held(oneshot::Receiver<T>),
}

impl<T> Answer<T> {
    /// For tests: the answer if it is there already.
    pub fn try_now(self) -> Option<T> {
        match self {
            Answer::Now(t) => Some(t),
            Answer::Held(mut rx) => rx.try_recv().ok(),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Empty,
    Preparing { deadline: Instant },
    Completing,
    Stable,
}

struct Member {
    protocols: Vec<(String, Bytes)>,
    session_timeout: Duration,
    rebalance_timeout: Duration,
    last_seen: Instant,
    join: Option<oneshot::Sender<JoinResult>>,
    sync: Option<oneshot::Sender<SyncResult>>,
    assignment: Bytes,
}

struct Group {
    name: String,
    state: State,
    generation: i32,
    protocol_type: Option<String>,
    protocol: Option<String>,
    leader: Option<String>,
    members: BTreeMap<String, Member>,
}

pub struct Groups {
    groups: Mutex<HashMap<String, Group>>,
    /// Generations replayed at start: a group's first generation after a restart is above them.
    replayed: HashMap<String, i32>,
    next_member: AtomicU64,
    nonce: u64,
    /// Completed generations, for the broker to record durably.
    generations: Mutex<Option<mpsc::UnboundedSender<(String, i32)>>>,
}

impl Groups {
    pub fn new(replayed: HashMap<String, i32>) -> Groups {
        let nonce = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_micros() as u64)
            .unwrap_or(0)
            ^ u64::from(std::process::id());
        Groups {
            groups: Mutex::new(HashMap::new()),
            replayed,
            next_member: AtomicU64::new(1),
            nonce,
            generations: Mutex::new(None),
        }
    }

    pub fn set_generation_sink(&self, tx: mpsc::UnboundedSender<(String, i32)>) {
        *lock(&self.generations) = Some(tx);
    }

    fn group<'a>(&self, m: &'a mut HashMap<String, Group>, name: &str) -> &'a mut Group {
        m.entry(name.to_string()).or_insert_with(|| Group {
            name: name.to_string(),
            state: State::Empty,
            generation: self.replayed.get(name).copied().unwrap_or(0),
            protocol_type: None,
            protocol: None,
            leader: None,
            members: BTreeMap::new(),
        })
    }

    pub fn join(&self, req: JoinRequest) -> Answer<JoinResult> {
        let refuse = |error, member_id: &str| JoinResult {
            error,
            generation: -1,
            member_id: member_id.to_string(),
            ..Default::default()
        };
        if req.group.is_empty() {
            return Answer::Now(refuse(codes::INVALID_GROUP_ID, &req.member_id));
        }
        if !(MIN_SESSION_TIMEOUT..=MAX_SESSION_TIMEOUT).contains(&req.session_timeout_ms) {
            return Answer::Now(refuse(codes::INVALID_SESSION_TIMEOUT, &req.member_id));
        }
        if req.protocols.is_empty() || req.protocol_type.is_empty() {
            return Answer::Now(refuse(codes::INCONSISTENT_GROUP_PROTOCOL, &req.member_id));
        }
        let mut m = lock(&self.groups);
        let g = self.group(&mut m, &req.group);
        if !req.member_id.is_empty() && !g.members.contains_key(&req.member_id) {
            return Answer::Now(refuse(codes::UNKNOWN_MEMBER_ID, &req.member_id));
        }
        let others_share = g
            .members
            .iter()
            .filter(|(id, _)| **id != req.member_id)
            .all(|(_, o)| {
                req.protocols
                    .iter()
                    .any(|(n, _)| o.protocols.iter().any(|(on, _)| on == n))
            });
        let type_ok = g.members.is_empty()
            || g.protocol_type
                .as_deref()
                .is_none_or(|t| t == req.protocol_type);
        if !others_share || !type_ok {
            return Answer::Now(refuse(codes::INCONSISTENT_GROUP_PROTOCOL, &req.member_id));
        }
        let member_id = if req.member_id.is_empty() {
            let n = self.next_member.fetch_add(1, Ordering::Relaxed);
            format!("{}-{:x}-{n}", req.client_id, self.nonce)
        } else {
            req.member_id.clone()
        };
        let (tx, rx) = oneshot::channel();
        let now = Instant::now();
        let member = g.members.entry(member_id).or_insert_with(|| Member {
            protocols: Vec::new(),
            session_timeout: Duration::ZERO,
            rebalance_timeout: Duration::ZERO,
            last_seen: now,
            join: None,
            sync: None,
            assignment: Bytes::new(),
        });
        member.protocols = req.protocols;
        member.session_timeout = Duration::from_millis(req.session_timeout_ms as u64);
        member.rebalance_timeout =
            Duration::from_millis(req.rebalance_timeout_ms.max(req.session_timeout_ms) as u64);
        member.last_seen = now;
        member.join = Some(tx);
        g.protocol_type = Some(req.protocol_type);
        self.prepare(g, now);
        self.try_complete(g);
        Answer::Held(rx)
    }

    /// Starts a rebalance (if none runs): held syncs learn of it.
    fn prepare(&self, g: &mut Group, now: Instant) {
        if matches!(g.state, State::Preparing { .. }) {
            return;
        }
        let wait = g
            .members
            .values()
            .map(|m| m.rebalance_timeout)
            .max()
            .unwrap_or(Duration::ZERO);
        g.state = State::Preparing {
            deadline: now + wait,
        };
        for m in g.members.values_mut() {
            if let Some(s) = m.sync.take() {
                let _ = s.send(SyncResult {
                    error: codes::REBALANCE_IN_PROGRESS,
                    ..Default::default()
                });
            }
        }
    }

    fn try_complete(&self, g: &mut Group) {
        if matches!(g.state, State::Preparing { .. })
            && g.members.values().all(|m| m.join.is_some())
        {
            self.complete(g);
        }
    }

    fn complete(&self, g: &mut Group) {
        g.generation = g.generation.wrapping_add(1).max(1);
        if let Some(tx) = lock(&self.generations).as_ref() {
            let _ = tx.send((g.name.clone(), g.generation));
        }
        if g.members.is_empty() {
            g.state = State::Empty;
            g.protocol = None;
            g.leader = None;
            return;
        }
        let leader = match &g.leader {
            Some(l) if g.members.contains_key(l) => l.clone(),
            _ => g.members.keys().next().cloned().unwrap_or_default(),
        };
        let protocol = g.members.get(&leader).and_then(|lm| {
            lm.protocols
                .iter()
                .map(|(n, _)| n)
                .find(|n| {
                    g.members
                        .values()
                        .all(|m| m.protocols.iter().any(|(mn, _)| mn == *n))
                })
                .cloned()
        });
        g.leader = Some(leader.clone());
        g.protocol = protocol.clone();
        g.state = State::Completing;
        let members: Vec<(String, Bytes)> = g
            .members
            .iter()
            .map(|(id, m)| {
                let meta = m
                    .protocols
                    .iter()
                    .find(|(n, _)| Some(n) == protocol.as_ref())
                    .map(|(_, b)| b.clone())
                    .unwrap_or_default();
                (id.clone(), meta)
            })
            .collect();
        for (id, m) in g.members.iter_mut() {
            if let Some(tx) = m.join.take() {
                let _ = tx.send(JoinResult {
                    error: if protocol.is_some() {
                        codes::NONE
                    } else {
                        codes::INCONSISTENT_GROUP_PROTOCOL
                    },
                    generation: g.generation,
                    protocol_type: g.protocol_type.clone(),
                    protocol: protocol.clone(),
                    leader: leader.clone(),
                    member_id: id.clone(),
                    members: if *id == leader {
                        members.clone()
                    } else {
                        Vec::new()
                    },
                });
            }
            m.last_seen = Instant::now();
        }
    }

    pub fn sync(
        &self,
        group: &str,
        generation: i32,
        member_id: &str,
        assignments: Vec<(String, Bytes)>,
    ) -> Answer<SyncResult> {
        let refuse = |error| SyncResult {
            error,
            ..Default::default()
        };
        let mut m = lock(&self.groups);
        let Some(g) = m.get_mut(group) else {
            return Answer::Now(refuse(codes::UNKNOWN_MEMBER_ID));
        };
        if !g.members.contains_key(member_id) {
            return Answer::Now(refuse(codes::UNKNOWN_MEMBER_ID));
        }
        if generation != g.generation {
            return Answer::Now(refuse(codes::ILLEGAL_GENERATION));
        }
        let answer = |g: &Group, a: Bytes| SyncResult {
            error: codes::NONE,
            protocol_type: g.protocol_type.clone(),
            protocol: g.protocol.clone(),
            assignment: a,
        };
        match g.state {
            State::Empty | State::Preparing { .. } => {
                Answer::Now(refuse(codes::REBALANCE_IN_PROGRESS))
            }
            State::Stable => {
                let a = g
                    .members
                    .get(member_id)
                    .map(|m| m.assignment.clone())
                    .unwrap_or_default();
                Answer::Now(answer(g, a))
            }
            State::Completing => {
                let (tx, rx) = oneshot::channel();
                if let Some(mem) = g.members.get_mut(member_id) {
                    mem.sync = Some(tx);
                    mem.last_seen = Instant::now();
                }
                if g.leader.as_deref() == Some(member_id) {
                    let mut by_member: HashMap<String, Bytes> = assignments.into_iter().collect();
                    for (id, mem) in g.members.iter_mut() {
                        mem.assignment = by_member.remove(id).unwrap_or_default();
                    }
                    g.state = State::Stable;
                    let snapshot: Vec<(String, Bytes)> = g
                        .members
                        .iter()
                        .map(|(id, mem)| (id.clone(), mem.assignment.clone()))
                        .collect();
                    for (id, a) in snapshot {
                        let reply = answer(g, a);
                        if let Some(s) = g.members.get_mut(&id).and_then(|mem| mem.sync.take()) {
                            let _ = s.send(reply);
                        }
                    }
                }
                Answer::Held(rx)
            }
        }
    }

    pub fn heartbeat(&self, group: &str, generation: i32, member_id: &str) -> i16 {
        let mut m = lock(&self.groups);
        let Some(g) = m.get_mut(group) else {
            return codes::UNKNOWN_MEMBER_ID;
        };
        let Some(mem) = g.members.get_mut(member_id) else {
            return codes::UNKNOWN_MEMBER_ID;
        };
        mem.last_seen = Instant::now();
        if generation != g.generation {
            return codes::ILLEGAL_GENERATION;
        }
        match g.state {
            State::Preparing { .. } => codes::REBALANCE_IN_PROGRESS,
            _ => codes::NONE,
        }
    }

    /// LeaveGroup: one error code per member named.
    pub fn leave(&self, group: &str, member_ids: &[String]) -> Vec<i16> {
        let mut m = lock(&self.groups);
        let Some(g) = m.get_mut(group) else {
            return vec![codes::UNKNOWN_MEMBER_ID; member_ids.len()];
        };
        let mut out = Vec::with_capacity(member_ids.len());
        let mut any = false;
        for id in member_ids {
            match g.members.remove(id) {
                Some(mem) => {
                    drop(mem);
                    any = true;
                    out.push(codes::NONE);
                }
                None => out.push(codes::UNKNOWN_MEMBER_ID),
            }
        }
        if any {
            self.membership_changed(g);
        }
        out
    }

    fn membership_changed(&self, g: &mut Group) {
        if g.members.is_empty() {
            if g.state != State::Empty {
                self.complete(g);
            }
            return;
        }
        self.prepare(g, Instant::now());
        self.try_complete(g);
    }

    /// OffsetCommit's membership check: NONE when the commit may go ahead.
    pub fn may_commit(&self, group: &str, generation: i32, member_id: &str) -> i16 {
        let m = lock(&self.groups);
        let g = m.get(group);
        if generation < 0 && member_id.is_empty() {
            // A consumer outside any group (assign() with commits): allowed while no group is
            // active under that name.
            return match g {
                Some(g) if !g.members.is_empty() => codes::ILLEGAL_GENERATION,
                _ => codes::NONE,
            };
        }
        let Some(g) = g else {
            return codes::UNKNOWN_MEMBER_ID;
        };
        if !g.members.contains_key(member_id) {
            return codes::UNKNOWN_MEMBER_ID;
        }
        if generation != g.generation {
            return codes::ILLEGAL_GENERATION;
        }
        if g.state == State::Completing {
            return codes::REBALANCE_IN_PROGRESS;
        }
        codes::NONE
    }

    /// Expires members whose session ran out and ends rebalances whose timeout passed. Called
    /// periodically.
    pub fn tick(&self, now: Instant) {
        let mut m = lock(&self.groups);
        for g in m.values_mut() {
            if let State::Preparing { deadline } = g.state {
                if now >= deadline {
                    g.members.retain(|_, mem| mem.join.is_some());
                    self.complete(g);
                    continue;
                }
            }
            let before = g.members.len();
            g.members.retain(|_, mem| {
                mem.join.is_some() || now.duration_since(mem.last_seen) < mem.session_timeout
            });
            if g.members.len() != before {
                tracing::info!(left = before - g.members.len(), "group members expired");
                self.membership_changed(g);
            }
        }
    }

    /// Every group's generation: the live ones, and those only replayed.
    pub fn generations(&self) -> Vec<(String, i32)> {
        let mut all = self.replayed.clone();
        for (name, g) in lock(&self.groups).iter() {
            all.insert(name.clone(), g.generation);
        }
        let mut v: Vec<_> = all.into_iter().collect();
        v.sort();
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(group: &str, member: &str) -> JoinRequest {
        JoinRequest {
            group: group.into(),
            member_id: member.into(),
            client_id: "c".into(),
            session_timeout_ms: 10_000,
            rebalance_timeout_ms: 10_000,
            protocol_type: "consumer".into(),
            protocols: vec![("range".into(), Bytes::from_static(b"meta"))],
        }
    }

    #[test]
    fn two_members_join_sync_and_rebalance_when_one_leaves() {
        let gs = Groups::new(HashMap::from([("g".to_string(), 4)]));
        let ja = gs.join(req("g", "")).try_now().unwrap();
        assert_eq!((ja.error, ja.generation), (codes::NONE, 5));
        assert_eq!(ja.leader, ja.member_id);
        // B joins: a rebalance starts; A learns through its heartbeat and rejoins.
        let Answer::Held(mut b) = gs.join(req("g", "")) else {
            panic!("B's join answered before A rejoined")
        };
        assert_eq!(
            gs.heartbeat("g", 5, &ja.member_id),
            codes::REBALANCE_IN_PROGRESS
        );
        let Answer::Held(mut a2) = gs.join(req("g", &ja.member_id)) else {
            panic!("A's rejoin was not held")
        };
        let (ja2, jb) = (a2.try_recv().unwrap(), b.try_recv().unwrap());
        assert_eq!((ja2.generation, jb.generation), (6, 6));
        assert_eq!(ja2.members.len(), 2);
        assert!(jb.members.is_empty());
        // B's sync waits for the leader's assignment.
        let Answer::Held(mut sb) = gs.sync("g", 6, &jb.member_id, vec![]) else {
            panic!("B's sync answered before the leader's")
        };
        assert!(sb.try_recv().is_err());
        let assignments = vec![
            (ja2.member_id.clone(), Bytes::from_static(b"A")),
            (jb.member_id.clone(), Bytes::from_static(b"B")),
        ];
        let sa = gs.sync("g", 6, &ja2.member_id, assignments);
        assert_eq!(sa.try_now().unwrap().assignment, Bytes::from_static(b"A"));
        assert_eq!(sb.try_recv().unwrap().assignment, Bytes::from_static(b"B"));
        assert_eq!(gs.may_commit("g", 6, &jb.member_id), codes::NONE);
        assert_eq!(
            gs.may_commit("g", 5, &jb.member_id),
            codes::ILLEGAL_GENERATION
        );
        // A leaves: B rejoins alone and leads generation 7.
        assert_eq!(
            gs.leave("g", std::slice::from_ref(&ja2.member_id)),
            vec![codes::NONE]
        );
        assert_eq!(
            gs.heartbeat("g", 6, &ja2.member_id),
            codes::UNKNOWN_MEMBER_ID
        );
        assert_eq!(
            gs.heartbeat("g", 6, &jb.member_id),
            codes::REBALANCE_IN_PROGRESS
        );
        let jb2 = gs.join(req("g", &jb.member_id)).try_now().unwrap();
        assert_eq!(
            (jb2.generation, jb2.leader.as_str()),
            (7, jb.member_id.as_str())
        );
    }

    #[test]
    fn silent_members_expire_and_rebalances_time_out() {
        let gs = Groups::new(HashMap::new());
        let mut r = req("g", "");
        r.session_timeout_ms = 1000;
        r.rebalance_timeout_ms = 1000;
        let ja = gs.join(r).try_now().unwrap();
        let mut r2 = req("g", "");
        r2.session_timeout_ms = 1000;
        r2.rebalance_timeout_ms = 1000;
        let Answer::Held(mut b) = gs.join(r2) else {
            panic!("B's join was not held")
        };
        // A never rejoins: after the rebalance timeout B gets a generation of its own.
        gs.tick(Instant::now() + Duration::from_secs(2));
        let jb = b.try_recv().unwrap();
        assert_eq!(jb.members.len(), 1);
        assert_ne!(jb.member_id, ja.member_id);
        assert_eq!(
            gs.heartbeat("g", jb.generation, &ja.member_id),
            codes::UNKNOWN_MEMBER_ID
        );
        gs.tick(Instant::now() + Duration::from_secs(5));
        assert_eq!(
            gs.heartbeat("g", jb.generation, &jb.member_id),
            codes::UNKNOWN_MEMBER_ID
        );
        assert_eq!(
            gs.join(req("", "")).try_now().map(|r| r.error),
            Some(codes::INVALID_GROUP_ID)
        );
    }
}
