//! Who holds what, as Metadata, DescribeCluster and FindCoordinator tell clients: a single
//! broker holds every partition itself; a node of a cluster names every node, the group's
//! leader, its voters and those in sync (`replica::View`).

use crate::admin::NODE_ID;
use crate::broker::Broker;

/// One broker as clients reach it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BrokerAddr {
    pub id: i32,
    pub host: String,
    pub port: i32,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Placement {
    /// This broker's id.
    pub node_id: i32,
    pub brokers: Vec<BrokerAddr>,
    /// Every partition's leader (and the controller); -1 while none is known.
    pub leader: i32,
    pub epoch: i32,
    pub replicas: Vec<i32>,
    pub in_sync: Vec<i32>,
}

impl Placement {
    /// This broker's own address.
    pub fn me(&self) -> Option<&BrokerAddr> {
        self.brokers.iter().find(|a| a.id == self.node_id)
    }
}

fn id(n: u64) -> i32 {
    i32::try_from(n).unwrap_or(i32::MAX)
}

/// "host:port" as Metadata carries it (a bad one was refused when the cluster was configured;
/// here it becomes port -1 rather than a panic).
fn split(addr: &str) -> (String, i32) {
    match addr.rsplit_once(':') {
        Some((h, p)) => (
            h.trim_start_matches('[').trim_end_matches(']').to_string(),
            p.parse::<u16>().map_or(-1, i32::from),
        ),
        None => (addr.to_string(), -1),
    }
}

pub fn of(b: &Broker) -> Placement {
    let Some(r) = b.replica() else {
        return Placement {
            node_id: NODE_ID,
            brokers: vec![BrokerAddr {
                id: NODE_ID,
                host: b.cfg.advertise_host.clone(),
                port: b.cfg.advertise_port,
            }],
            leader: NODE_ID,
            epoch: crate::epoch::LEADER_EPOCH,
            replicas: vec![NODE_ID],
            in_sync: vec![NODE_ID],
        };
    };
    let v = r.view();
    let brokers = r
        .members()
        .iter()
        .map(|(&n, a)| {
            let (host, port) = split(&a.kafka);
            BrokerAddr {
                id: id(n),
                host,
                port,
            }
        })
        .collect();
    Placement {
        node_id: id(v.node_id),
        brokers,
        leader: v.leader.map_or(-1, id),
        epoch: i32::try_from(v.term).unwrap_or(i32::MAX),
        replicas: v.voters.into_iter().map(id).collect(),
        in_sync: v.in_sync.into_iter().map(id).collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::split;

    #[test]
    fn kafka_addresses_split_into_host_and_port() {
        assert_eq!(split("127.0.0.1:9092"), ("127.0.0.1".into(), 9092));
        assert_eq!(split("[::1]:9093"), ("::1".into(), 9093));
        assert_eq!(split("host:notaport"), ("host".into(), -1));
        assert_eq!(split("host"), ("host".into(), -1));
    }
}
