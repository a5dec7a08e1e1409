//! `/metrics` per Kafka partition: where each partition starts and ends on this broker (labels
//! `topic`, `partition`). On a node of a cluster every partition is applied from the one Raft
//! group, so the same series on every node show how far each node applied each partition; on
//! the leader, the end offset is the high watermark clients read up to.

use std::fmt::Write as _;

/// One partition's figures: topic, index, log start offset, end offset (next offset).
pub type PartitionFigures = (String, u32, u64, u64);

/// The first partitions' figures, and how many partitions follow them.
pub type PartitionsRead = (Vec<PartitionFigures>, usize);

/// Partitions shown: a broker may hold 100,000 of them, and a scrape of two series each would
/// then be megabytes; the rest are counted in `nvmq_partition_series_omitted`.
pub const MAX_PARTITIONS: usize = 1_000;

/// Renders `parts` (the first [`MAX_PARTITIONS`] at most, in topic and index order) and how
/// many more there are.
pub fn render(out: &mut String, parts: &[PartitionFigures], more: usize) {
    let shown = parts.len().min(MAX_PARTITIONS);
    let omitted = more + (parts.len() - shown);
    let parts = &parts[..shown];
    type Pick = fn(&PartitionFigures) -> u64;
    let series: [(&str, &str, Pick); 2] = [
        (
            "nvmq_partition_start_offset",
            "The partition's first offset still held (retention and DeleteRecords raise it).",
            |p| p.2,
        ),
        (
            "nvmq_partition_end_offset",
            "The partition's next offset: its durable records end here (the high watermark).",
            |p| p.3,
        ),
    ];
    for (name, help, pick) in series {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} gauge");
        // Topic names hold only [a-zA-Z0-9._-] (checked at creation): nothing to escape.
        for p in parts {
            let _ = writeln!(
                out,
                "{name}{{topic=\"{}\",partition=\"{}\"}} {}",
                p.0,
                p.1,
                pick(p)
            );
        }
    }
    let name = "nvmq_partition_series_omitted";
    let _ = writeln!(
        out,
        "# HELP {name} Partitions past the first {MAX_PARTITIONS} (by topic and index), whose \
         offset series are left out.\n# TYPE {name} gauge\n{name} {omitted}"
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_partition_shows_its_start_and_end() {
        let mut out = String::new();
        render(
            &mut out,
            &[("orders".into(), 0, 0, 120), ("orders".into(), 1, 40, 95)],
            0,
        );
        for line in [
            "nvmq_partition_start_offset{topic=\"orders\",partition=\"1\"} 40",
            "nvmq_partition_end_offset{topic=\"orders\",partition=\"0\"} 120",
            "nvmq_partition_end_offset{topic=\"orders\",partition=\"1\"} 95",
        ] {
            assert!(out.lines().any(|l| l == line), "no {line:?} in\n{out}");
        }
        assert_eq!(out.matches("# TYPE").count(), 3, "{out}");
        assert!(out.contains("nvmq_partition_series_omitted 0\n"), "{out}");
    }

    #[test]
    fn past_the_cap_partitions_are_counted_not_shown() {
        let parts: Vec<PartitionFigures> = (0..MAX_PARTITIONS as u32 + 5)
            .map(|i| ("t".to_string(), i, 0, u64::from(i)))
            .collect();
        let mut out = String::new();
        render(&mut out, &parts, 7);
        assert_eq!(
            out.matches("nvmq_partition_end_offset{").count(),
            MAX_PARTITIONS
        );
        assert!(
            out.contains("nvmq_partition_series_omitted 12\n"),
            "{out:.200}"
        );
    }
}
