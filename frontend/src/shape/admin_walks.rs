//! The walks of the config, DeleteRecords and DescribeLogDirs requests (their flexible versions
//! included: the walk reads compact counts and tagged fields when the version is flexible).

use kafka_protocol::messages::ApiKey;

use super::{Walk, R};

pub(super) fn check(api: ApiKey, v: i16, w: &mut Walk<'_>) -> R {
    match api {
        ApiKey::DescribeConfigs => {
            w.array(false, |w| {
                w.i8()?;
                w.string(false)?;
                w.array(true, |w| w.string(false))?;
                w.tags()
            })?;
            w.i8()?;
            if v >= 3 {
                w.i8()?;
            }
        }
        ApiKey::AlterConfigs | ApiKey::IncrementalAlterConfigs => {
            let incremental = api == ApiKey::IncrementalAlterConfigs;
            w.array(false, |w| {
                w.i8()?;
                w.string(false)?;
                w.array(false, |w| {
                    w.string(false)?;
                    if incremental {
                        w.i8()?;
                    }
                    w.string(true)?;
                    w.tags()
                })?;
                w.tags()
            })?;
            w.i8()?;
        }
        ApiKey::DeleteRecords => {
            w.array(false, |w| {
                w.string(false)?;
                w.array(false, |w| {
                    w.i32()?;
                    w.i64()?;
                    w.tags()
                })?;
                w.tags()
            })?;
            w.i32()?;
        }
        ApiKey::DescribeLogDirs => {
            w.array(true, |w| {
                w.string(false)?;
                w.array(false, |w| w.i32())?;
                w.tags()
            })?;
        }
        _ => return Ok(()),
    }
    w.tags()
}
