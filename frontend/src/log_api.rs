//! DeleteRecords (raises partitions' log start offsets, see `broker::topic_state`) and
//! DescribeLogDirs (one log dir per device, its partitions and their sizes in its ring).

use std::sync::Arc;

use kafka_protocol::messages::delete_records_response::{
    DeleteRecordsPartitionResult, DeleteRecordsTopicResult,
};
use kafka_protocol::messages::describe_log_dirs_response::{
    DescribeLogDirsPartition, DescribeLogDirsResult, DescribeLogDirsTopic,
};
use kafka_protocol::messages::{
    DeleteRecordsRequest, DeleteRecordsResponse, DescribeLogDirsRequest, DescribeLogDirsResponse,
    TopicName,
};
use kafka_protocol::protocol::StrBytes;

use crate::acl::{check, Operation};
use crate::broker::{Broker, Raised};
use crate::codes;
use crate::conn::{Ctx, Reply};

pub async fn delete_records(b: &Arc<Broker>, ctx: &Ctx, req: DeleteRecordsRequest) -> Reply {
    let mut resp = DeleteRecordsResponse::default();
    for t in req.topics {
        let mut tr = DeleteRecordsTopicResult::default();
        tr.name = t.name.clone();
        let allowed = check::topic(b, ctx, Operation::Delete, t.name.as_str());
        for p in t.partitions {
            let mut pr = DeleteRecordsPartitionResult::default();
            pr.partition_index = p.partition_index;
            pr.low_watermark = -1;
            if !allowed {
                pr.error_code = codes::TOPIC_AUTHORIZATION_FAILED;
                tr.partitions.push(pr);
                continue;
            }
            let part = b.topics().partition(t.name.as_str(), p.partition_index);
            let r = match (part, p.offset) {
                (None, _) => Ok(Raised::NoPartition),
                // -1: up to the high watermark.
                (Some(pid), -1) => match b.bounds(pid) {
                    Some((_, end)) => b.raise_start(pid, end).await,
                    None => Ok(Raised::NoPartition),
                },
                (Some(pid), o) => match u64::try_from(o) {
                    Ok(o) => b.raise_start(pid, o).await,
                    Err(_) => Ok(Raised::OutOfRange { end: 0 }),
                },
            };
            match r {
                Ok(Raised::Start(s)) => pr.low_watermark = s as i64,
                Ok(Raised::NoPartition) => pr.error_code = codes::UNKNOWN_TOPIC_OR_PARTITION,
                Ok(Raised::OutOfRange { .. }) => pr.error_code = codes::OFFSET_OUT_OF_RANGE,
                Err(e) => {
                    tracing::warn!(topic = t.name.as_str(), partition = p.partition_index, error = %e, "recording a log start offset failed");
                    pr.error_code = codes::KAFKA_STORAGE_ERROR;
                }
            }
            tr.partitions.push(pr);
        }
        resp.topics.push(tr);
    }
    ctx.ready(&resp)
}

/// What a device is called in DescribeLogDirs.
fn log_dir(b: &Broker, dev: usize) -> String {
    b.cfg
        .log_dirs
        .get(dev)
        .cloned()
        .unwrap_or_else(|| format!("device-{dev}"))
}

/// One result per device: the partitions it holds (all of them, or those asked for), each with
/// the bytes its retained records take in the ring (from its start offset on) and no lag (one
/// replica).
pub fn describe_log_dirs(b: &Arc<Broker>, ctx: &Ctx, req: DescribeLogDirsRequest) -> Reply {
    // Kafka's: Describe on the cluster (v3+ say why; older versions just get no log dirs).
    if !check::cluster(b, ctx, Operation::Describe) {
        let mut resp = DescribeLogDirsResponse::default();
        if ctx.version >= 3 {
            resp.error_code = codes::CLUSTER_AUTHORIZATION_FAILED;
        }
        return ctx.ready(&resp);
    }
    let wanted: Option<Vec<(String, Vec<i32>)>> = req.topics.map(|ts| {
        ts.into_iter()
            .map(|t| (t.topic.as_str().to_string(), t.partitions))
            .collect()
    });
    let topics: Vec<(String, Vec<crate::PartRef>)> = b
        .topics()
        .map
        .iter()
        .map(|(n, p)| (n.clone(), p.clone()))
        .collect();
    let mut resp = DescribeLogDirsResponse::default();
    for (dev, log) in b.logs().iter().enumerate() {
        let mut r = DescribeLogDirsResult::default();
        r.log_dir = StrBytes::from_string(log_dir(b, dev));
        let geo = log.geometry();
        r.total_bytes = i64::try_from(geo.log_size).unwrap_or(i64::MAX);
        r.usable_bytes = -1;
        for (name, parts) in &topics {
            let asked: Option<&Vec<i32>> = match &wanted {
                None => None,
                Some(w) => match w.iter().find(|(n, _)| n == name) {
                    Some((_, ps)) => Some(ps),
                    None => continue,
                },
            };
            let mut t = DescribeLogDirsTopic::default();
            t.name = TopicName(StrBytes::from_string(name.clone()));
            for (i, &p) in parts.iter().enumerate() {
                let index = i32::try_from(i).unwrap_or(i32::MAX);
                if p.device() != dev || asked.is_some_and(|a| !a.contains(&index)) {
                    continue;
                }
                let start = b.bounds(p).map_or(0, |(s, _)| s);
                let mut pd = DescribeLogDirsPartition::default();
                pd.partition_index = index;
                pd.partition_size = log
                    .partition_bytes(p.id, start)
                    .map_or(0, |v| i64::try_from(v).unwrap_or(i64::MAX));
                pd.offset_lag = 0;
                t.partitions.push(pd);
            }
            if !t.partitions.is_empty() {
                r.topics.push(t);
            }
        }
        resp.results.push(r);
    }
    ctx.ready(&resp)
}
