pub fn run(_a: CheckStorageArgs) -> anyhow::Result<crate::Status> {
    anyhow::bail!("todo")
}
#[derive(clap::Args, Debug, Clone)]
pub struct CheckStorageArgs {}
