//! KIP-430's authorized operations: the bit field (a bit per AclOperation code) of what the
//! requesting principal may do on a resource, as Metadata, DescribeGroups and DescribeCluster
//! report it when asked. Each bit is the decision of the same check the requests go through
//! (implied operations and super users included); with the authorizer off every check passes,
//! so the field holds every operation the resource type supports.

use super::{Operation, ResourceType, CLUSTER_NAME};
use crate::broker::Broker;
use crate::conn::Ctx;

/// The field when the client did not ask for it (Kafka's default).
pub const NOT_REQUESTED: i32 = i32::MIN;

/// The operations a binding can give on each resource type (Kafka's
/// `AclEntry.supportedOperations`; All is not one of them).
pub fn supported(rt: ResourceType) -> &'static [Operation] {
    use Operation::*;
    match rt {
        ResourceType::Topic => &[
            Read,
            Write,
            Create,
            Describe,
            Delete,
            Alter,
            DescribeConfigs,
            AlterConfigs,
        ],
        ResourceType::Group => &[Read, Describe, Delete],
        ResourceType::Cluster => &[
            Create,
            ClusterAction,
            DescribeConfigs,
            AlterConfigs,
            IdempotentWrite,
            Alter,
            Describe,
        ],
        ResourceType::TransactionalId => &[Describe, Write],
    }
}

/// The operations on resource `name` of type `rt` the request's principal may do.
pub fn authorized(b: &Broker, ctx: &Ctx, rt: ResourceType, name: &str) -> i32 {
    supported(rt)
        .iter()
        .filter(|&&op| b.acl().authorize(&ctx.session, op, rt, name))
        .fold(0, |bits, op| bits | 1 << op.code())
}

/// `authorized` on the cluster.
pub fn cluster(b: &Broker, ctx: &Ctx) -> i32 {
    authorized(b, ctx, ResourceType::Cluster, CLUSTER_NAME)
}

/// The operations a bit field holds, in code order (what tests and tools print).
pub fn decode(bits: i32) -> Vec<Operation> {
    (0..32)
        .filter(|i| bits & (1 << i) != 0)
        .filter_map(|i| Operation::from_code(i as i8).ok())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_field_decodes_to_the_operations_it_was_made_of() {
        for rt in [
            ResourceType::Topic,
            ResourceType::Group,
            ResourceType::Cluster,
            ResourceType::TransactionalId,
        ] {
            let bits = supported(rt).iter().fold(0, |b, op| b | 1 << op.code());
            let mut want = supported(rt).to_vec();
            want.sort_by_key(|op| op.code());
            assert_eq!(decode(bits), want, "{rt:?}");
        }
        assert!(decode(NOT_REQUESTED).is_empty());
    }
}
