//! Swapping storage: a `Store` implementation of your own (here in memory; PostgreSQL or FoundationDB would
//! implement the same five methods) given to the runtime, which keeps its agent records there.
#![allow(clippy::print_stdout)] // printing is what an example does

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, PoisonError};

use agenthold_core::store::BatchOp;
use agenthold_core::{SandboxSpec, Store};
use agenthold_sandbox::Runtime;

/// One table: byte keys to byte values, ordered (prefix scans are range scans).
type Table = BTreeMap<Vec<u8>, Vec<u8>>;

/// Tables of byte keys and values in memory. Durable "when the call returns" trivially holds for a store
/// that does not outlive the process; a real one would commit before returning.
#[derive(Default)]
struct MemoryStore {
    tables: Mutex<BTreeMap<String, Table>>,
}

impl MemoryStore {
    fn tables(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, Table>> {
        self.tables.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

#[async_trait::async_trait]
impl Store for MemoryStore {
    async fn get(&self, table: &str, key: &[u8]) -> agenthold_core::Result<Option<Vec<u8>>> {
        Ok(self.tables().get(table).and_then(|t| t.get(key)).cloned())
    }

    async fn put(&self, table: &str, key: &[u8], value: &[u8]) -> agenthold_core::Result<()> {
        self.tables()
            .entry(table.to_owned())
            .or_default()
            .insert(key.to_vec(), value.to_vec());
        Ok(())
    }

    async fn delete(&self, table: &str, key: &[u8]) -> agenthold_core::Result<bool> {
        Ok(self
            .tables()
            .get_mut(table)
            .is_some_and(|t| t.remove(key).is_some()))
    }

    async fn scan_prefix(
        &self,
        table: &str,
        prefix: &[u8],
    ) -> agenthold_core::Result<Vec<(Vec<u8>, Vec<u8>)>> {
        let tables = self.tables();
        Ok(tables
            .get(table)
            .map(|t| {
                t.range(prefix.to_vec()..)
                    .take_while(|(k, _)| k.starts_with(prefix))
                    .map(|(k, v)| (k.clone(), v.clone()))
                    .collect()
            })
            .unwrap_or_default())
    }

    async fn batch(&self, ops: Vec<BatchOp>) -> agenthold_core::Result<()> {
        // One lock for the whole batch: all or nothing.
        let mut tables = self.tables();
        for op in ops {
            match op {
                BatchOp::Put { table, key, value } => {
                    tables.entry(table).or_default().insert(key, value);
                }
                BatchOp::Delete { table, key } => {
                    if let Some(t) = tables.get_mut(&table) {
                        t.remove(&key);
                    }
                }
            }
        }
        Ok(())
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt().with_env_filter("warn").init();
    let store = Arc::new(MemoryStore::default());
    let data_dir = std::env::var("AGENTHOLD_DATA_DIR").unwrap_or_else(|_| "/tmp/agenthold-swap-store".into());
    let runtime = Runtime::builder()
        .data_dir(&data_dir)
        .store(Arc::clone(&store) as Arc<dyn Store>)
        .build()
        .await?;
    let agent = runtime.create_sandbox(SandboxSpec::default()).await?;
    let tables: Vec<(String, usize)> = store.tables().iter().map(|(n, t)| (n.clone(), t.len())).collect();
    println!("sandbox {agent} created; the runtime's records are in the custom store: {tables:?}");
    let out = runtime.exec(&agent, &["uname", "-a"]).await?;
    print!("{}", String::from_utf8_lossy(&out.stdout));
    runtime.remove(&agent).await?;
    println!(
        "removed; records left: {:?}",
        store.tables().values().map(BTreeMap::len).sum::<usize>()
    );
    runtime.shutdown().await;
    Ok(())
}
