//! The Raft groups a node runs, by group id: where the server sends each frame.

use std::collections::HashMap;
use std::sync::{Arc, RwLock};

use openraft::Raft;

use crate::state_machine::StateMachine;
use crate::types::TypeConfig;

/// A group's Raft handle.
pub type GroupRaft = Raft<TypeConfig, StateMachine>;

/// Shared between the node (which adds and removes groups) and its server's connections.
#[derive(Clone, Default)]
pub struct Registry {
    groups: Arc<RwLock<HashMap<u32, GroupRaft>>>,
}

impl Registry {
    pub fn insert(&self, group: u32, raft: GroupRaft) -> Option<GroupRaft> {
        self.write().insert(group, raft)
    }

    pub fn remove(&self, group: u32) -> Option<GroupRaft> {
        self.write().remove(&group)
    }

    pub fn get(&self, group: u32) -> Option<GroupRaft> {
        self.read().get(&group).cloned()
    }

    /// Removes every group and returns them (stopping a node).
    pub fn take_all(&self) -> Vec<(u32, GroupRaft)> {
        self.write().drain().collect()
    }

    // A poisoned lock means a panic elsewhere while it was held; the map itself is still whole
    // (inserts and removes do not panic between steps).
    fn read(&self) -> std::sync::RwLockReadGuard<'_, HashMap<u32, GroupRaft>> {
        self.groups.read().unwrap_or_else(|p| p.into_inner())
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, HashMap<u32, GroupRaft>> {
        self.groups.write().unwrap_or_else(|p| p.into_inner())
    }
}
