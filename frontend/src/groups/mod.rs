//! The classic consumer-group coordinator (JoinGroup / SyncGroup / Heartbeat / LeaveGroup):
//! Empty → PreparingRebalance → CompletingRebalance → Stable. Join answers are held until every
//! known member has rejoined or the rebalance timeout removed the rest; SyncGroup answers wait for
//! the leader's assignment. Generations are recorded in `__nvmq_meta` so that they keep rising
//! across restarts; members are not: after a restart every member rejoins (UNKNOWN_MEMBER_ID).
//!
//! Static members (KIP-345, `group.instance.id`): a restarted one (empty member id, known
//! instance id) takes its old member's place and assignment under a new member id, without a
//! rebalance while the group is stable and its subscription unchanged; the old member id is
//! fenced (FENCED_INSTANCE_ID) from then on. What operators' tools read (ListGroups,
//! DescribeGroups) is in `view`.

mod view;

pub use view::{GroupView, MemberView};

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
    /// `group.instance.id` (JoinGroup v5+): a static member.
    pub instance_id: Option<String>,
    pub client_id: String,
    /// The client's address as DescribeGroups shows it.
    pub client_host: String,
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
    client_id: String,
    client_host: String,
    instance_id: Option<String>,
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
    /// Static members: instance id → its current member id.
    statics: HashMap<String, String>,
    /// Since when the group has had no members (for the expiry of empty groups).
    empty_since: Option<Instant>,
    /// The first rebalance of a group that was empty completes no sooner than this (Kafka's
    /// `group.initial.rebalance.delay.ms`), so that members starting together join one
    /// generation instead of rebalancing once per arrival.
    initial_hold: Option<Instant>,
}

impl Group {
    /// Takes a member out (and its instance id, if static).
    fn remove_member(&mut self, id: &str) -> Option<Member> {
        let mem = self.members.remove(id)?;
        if let Some(inst) = &mem.instance_id {
            if self.statics.get(inst).is_some_and(|m| m == id) {
                self.statics.remove(inst);
            }
        }
        Some(mem)
    }

    /// FENCED_INSTANCE_ID when `instance` belongs to another member id than `member_id`.
    fn fenced(&self, instance: Option<&str>, member_id: &str) -> Option<i16> {
        let current = self.statics.get(instance?)?;
        (current != member_id).then_some(codes::FENCED_INSTANCE_ID)
    }
}

pub struct Groups {
    groups: Mutex<HashMap<String, Group>>,
    /// Generations replayed at start: a group's first generation after a restart is above them.
    replayed: HashMap<String, i32>,
    next_member: AtomicU64,
    nonce: u64,
    /// Completed generations, for the broker to record durably.
    generations: Mutex<Option<mpsc::UnboundedSender<(String, i32)>>>,
    /// How long a group that was empty waits for more members before its first rebalance
    /// completes (each new member waits this long again, within the rebalance timeout).
    initial_delay: Duration,
}

impl Groups {
    pub fn new(replayed: HashMap<String, i32>) -> Groups {
        Groups::with_initial_delay(replayed, Duration::ZERO)
    }

    /// As `new`, with Kafka's `group.initial.rebalance.delay.ms`.
    pub fn with_initial_delay(replayed: HashMap<String, i32>, initial_delay: Duration) -> Groups {
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
            initial_delay,
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
            statics: HashMap::new(),
            empty_since: None,
            initial_hold: None,
        })
    }

    fn new_member_id(&self, client_id: &str) -> String {
        let n = self.next_member.fetch_add(1, Ordering::Relaxed);
        format!("{client_id}-{:x}-{n}", self.nonce)
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
        let now = Instant::now();
        let stale = m.get(&req.group).and_then(|g| {
            (!req.member_id.is_empty())
                .then(|| g.fenced(req.instance_id.as_deref(), &req.member_id))
                .flatten()
        });
        if let Some(e) = stale {
            return Answer::Now(refuse(e, &req.member_id));
        }
        // A refused join leaves no group behind (ListGroups would show it).
        if !req.member_id.is_empty()
            && !m
                .get(&req.group)
                .is_some_and(|g| g.members.contains_key(&req.member_id))
        {
            return Answer::Now(refuse(codes::UNKNOWN_MEMBER_ID, &req.member_id));
        }
        let g = self.group(&mut m, &req.group);
        let static_old = match req.instance_id.as_deref() {
            Some(inst) => match g.statics.get(inst) {
                Some(old) if req.member_id.is_empty() => Some(old.clone()),
                _ => None,
            },
            None => None,
        };
        // The member this join replaces or renews: it does not count among the others.
        let me = static_old.as_deref().unwrap_or(&req.member_id);
        let others_share = g.members.iter().filter(|(id, _)| *id != me).all(|(_, o)| {
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
        let (member_id, kept) = match &static_old {
            Some(old) => {
                let new_id = self.new_member_id(&req.client_id);
                (new_id.clone(), Some(self.replace_static(g, old, new_id)))
            }
            None if req.member_id.is_empty() => (self.new_member_id(&req.client_id), None),
            None => (req.member_id.clone(), None),
        };
        let arriving = !g.members.contains_key(&member_id);
        let member = g
            .members
            .entry(member_id.clone())
            .or_insert_with(|| Member {
                client_id: String::new(),
                client_host: String::new(),
                instance_id: None,
                protocols: Vec::new(),
                session_timeout: Duration::ZERO,
                rebalance_timeout: Duration::ZERO,
                last_seen: now,
                join: None,
                sync: None,
                assignment: Bytes::new(),
            });
        let unchanged = member.protocols == req.protocols;
        member.protocols = req.protocols;
        member.client_id = req.client_id;
        member.client_host = req.client_host;
        member.instance_id = req.instance_id.clone();
        member.session_timeout = Duration::from_millis(req.session_timeout_ms as u64);
        member.rebalance_timeout =
            Duration::from_millis(req.rebalance_timeout_ms.max(req.session_timeout_ms) as u64);
        member.last_seen = now;
        if let Some(inst) = req.instance_id {
            g.statics.insert(inst, member_id.clone());
        }
        g.protocol_type = Some(req.protocol_type);
        g.empty_since = None;
        // A restarted static member of a stable group whose subscription did not change gets
        // its old assignment back (SyncGroup hands it over) without disturbing the others. The
        // leader named is the one before the replacement, so that a restarted leader does not
        // compute an assignment a stable group would not hand out.
        if let Some(reported_leader) = kept {
            if g.state == State::Stable && unchanged {
                return Answer::Now(JoinResult {
                    error: codes::NONE,
                    generation: g.generation,
                    protocol_type: g.protocol_type.clone(),
                    protocol: g.protocol.clone(),
                    leader: reported_leader,
                    member_id,
                    members: Vec::new(),
                });
            }
        }
        let (tx, rx) = oneshot::channel();
        if let Some(mem) = g.members.get_mut(&member_id) {
            mem.join = Some(tx);
        }
        self.prepare(g, now);
        if arriving {
            self.extend_hold(g, now);
        }
        self.try_complete(g, now);
        Answer::Held(rx)
    }

    /// Puts `new_id` in the place of static member `old` (its protocols and assignment, and the
    /// leadership if it led); the old member's held answers are fenced. Returns the leader as it
    /// was before.
    fn replace_static(&self, g: &mut Group, old: &str, new_id: String) -> String {
        let before = g.leader.clone().unwrap_or_default();
        if let Some(mut mem) = g.remove_member(old) {
            if let Some(j) = mem.join.take() {
                let _ = j.send(JoinResult {
                    error: codes::FENCED_INSTANCE_ID,
                    generation: -1,
                    member_id: old.to_string(),
                    ..Default::default()
                });
            }
            if let Some(s) = mem.sync.take() {
                let _ = s.send(SyncResult {
                    error: codes::FENCED_INSTANCE_ID,
                    ..Default::default()
                });
            }
            if g.leader.as_deref() == Some(old) {
                g.leader = Some(new_id.clone());
            }
            g.members.insert(new_id, mem);
        }
        tracing::info!(group = %g.name, old, "static member replaced");
        before
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
        if g.state == State::Empty && !self.initial_delay.is_zero() {
            g.initial_hold = Some(now + self.initial_delay.min(wait));
        }
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

    /// A member arrived during the initial hold: wait for others as long again, but never past
    /// the rebalance's deadline.
    fn extend_hold(&self, g: &mut Group, now: Instant) {
        if let (Some(hold), State::Preparing { deadline }) = (g.initial_hold, g.state) {
            if now < hold {
                let left = deadline.saturating_duration_since(now);
                g.initial_hold = Some(now + self.initial_delay.min(left));
            }
        }
    }

    fn try_complete(&self, g: &mut Group, now: Instant) {
        let held = g.initial_hold.is_some_and(|h| now < h);
        if matches!(g.state, State::Preparing { .. })
            && !held
            && g.members.values().all(|m| m.join.is_some())
        {
            self.complete(g);
        }
    }

    fn complete(&self, g: &mut Group) {
        g.initial_hold = None;
        g.generation = g.generation.wrapping_add(1).max(1);
        if let Some(tx) = lock(&self.generations).as_ref() {
            let _ = tx.send((g.name.clone(), g.generation));
        }
        if g.members.is_empty() {
            g.state = State::Empty;
            g.protocol = None;
            g.leader = None;
            g.empty_since = Some(Instant::now());
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
        instance: Option<&str>,
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
        if let Some(e) = g.fenced(instance, member_id) {
            return Answer::Now(refuse(e));
        }
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

    pub fn heartbeat(
        &self,
        group: &str,
        generation: i32,
        member_id: &str,
        instance: Option<&str>,
    ) -> i16 {
        let mut m = lock(&self.groups);
        let Some(g) = m.get_mut(group) else {
            return codes::UNKNOWN_MEMBER_ID;
        };
        if let Some(e) = g.fenced(instance, member_id) {
            return e;
        }
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

    /// LeaveGroup: one error code per member named, by member id or (static members, v3+) by
    /// instance id; a member id given with an instance id must be the instance's current one.
    pub fn leave(&self, group: &str, leaving: &[(String, Option<String>)]) -> Vec<i16> {
        let mut m = lock(&self.groups);
        let Some(g) = m.get_mut(group) else {
            return vec![codes::UNKNOWN_MEMBER_ID; leaving.len()];
        };
        let mut out = Vec::with_capacity(leaving.len());
        let mut any = false;
        for (id, instance) in leaving {
            let id = match instance.as_deref() {
                None => id.clone(),
                Some(inst) => match g.statics.get(inst) {
                    None => {
                        out.push(codes::UNKNOWN_MEMBER_ID);
                        continue;
                    }
                    Some(cur) if !id.is_empty() && cur != id => {
                        out.push(codes::FENCED_INSTANCE_ID);
                        continue;
                    }
                    Some(cur) => cur.clone(),
                },
            };
            match g.remove_member(&id) {
                Some(_) => {
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
        let now = Instant::now();
        self.prepare(g, now);
        self.try_complete(g, now);
    }

    /// OffsetCommit's membership check: NONE when the commit may go ahead.
    pub fn may_commit(
        &self,
        group: &str,
        generation: i32,
        member_id: &str,
        instance: Option<&str>,
    ) -> i16 {
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
        if let Some(e) = g.fenced(instance, member_id) {
            return e;
        }
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
                    g.statics.retain(|_, id| g.members.contains_key(id));
                    self.complete(g);
                    continue;
                }
                // The initial hold may have passed with everyone joined.
                self.try_complete(g, now);
            }
            let before = g.members.len();
            g.members.retain(|_, mem| {
                mem.join.is_some() || now.duration_since(mem.last_seen) < mem.session_timeout
            });
            g.statics.retain(|_, id| g.members.contains_key(id));
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
mod tests;
