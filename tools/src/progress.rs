//! Progress bars on stderr for anything that can take more than a second. indicatif draws only
//! when stderr is a terminal, so scripts and tests see clean output.

use std::time::Duration;

use indicatif::{ProgressBar, ProgressStyle};

/// A spinner with elapsed time, for steps whose length is unknown (zero-filling a new file).
pub fn spinner(msg: impl Into<String>) -> ProgressBar {
    let pb = ProgressBar::new_spinner();
    if let Ok(style) = ProgressStyle::with_template("{spinner} {msg} [{elapsed}]") {
        pb.set_style(style);
    }
    pb.set_message(msg.into());
    pb.enable_steady_tick(Duration::from_millis(120));
    pb
}

/// A bar over `total` bytes.
pub fn bytes_bar(total: u64, msg: impl Into<String>) -> ProgressBar {
    let pb = ProgressBar::new(total);
    if let Ok(style) = ProgressStyle::with_template(
        "{msg} [{bar:30}] {bytes}/{total_bytes} {bytes_per_sec} eta {eta}",
    ) {
        pb.set_style(style.progress_chars("=> "));
    }
    pb.set_message(msg.into());
    pb
}

/// A bar over `total` steps (benchmark scenarios, measurement phases).
pub fn steps_bar(total: u64, msg: impl Into<String>) -> ProgressBar {
    let pb = ProgressBar::new(total);
    if let Ok(style) = ProgressStyle::with_template("{msg} [{bar:30}] {pos}/{len} [{elapsed}]") {
        pb.set_style(style.progress_chars("=> "));
    }
    pb.set_message(msg.into());
    pb.enable_steady_tick(Duration::from_millis(200));
    pb
}
