//! The walks of the config, DeleteRecords and DescribeLogDirs requests, up to their top-level
//! tagged fields (the walker reads compact counts and tagged fields when the version is
//! flexible).

use kafka_protocol::messages::ApiKey;

use super::{Walk, R};

pub(super) fn walk(api: ApiKey, v: i16, w: &mut Walk<'_>) -> R {
    match api {
        ApiKey::DescribeConfigs => {
            w.structs(false, |w| {
                w.i8()?;
                w.string(false)?;
                w.array(true, |w| w.string(false))
            })?;
            w.i8()?;
            if v >= 3 {
                w.i8()?;
            }
            Ok(())
        }
        ApiKey::AlterConfigs | ApiKey::IncrementalAlterConfigs => {
            let incremental = api == ApiKey::IncrementalAlterConfigs;
            w.structs(false, |w| {
                w.i8()?;
                w.string(false)?;
                w.structs(false, |w| {
                    w.string(false)?;
                    if incremental {
                        w.i8()?;
                    }
                    w.string(true)
                })
            })?;
            w.i8()
        }
        ApiKey::DeleteRecords => {
            w.structs(false, |w| {
                w.string(false)?;
                w.structs(false, |w| {
                    w.i32()?;
                    w.i64()
                })
            })?;
            w.i32()
        }
        ApiKey::DescribeLogDirs => w.structs(true, |w| {
            w.string(false)?;
            w.array(false, |w| w.i32())
        }),
        _ => Ok(()),
    }
}
