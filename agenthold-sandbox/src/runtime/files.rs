//! Files in a sandbox (P1, S10): read, write, list, remove, and resolve to the canonical path a file check
//! compares.
//!
//! Paths for listing, removing and resolving are checked here first ([`sandbox_path`]: absolute, no `..`,
//! no NUL), whatever sandbox runtime is behind, and handed on in normal form.
// enforces: S10

use agenthold_core::AgentId;
use agenthold_core::sandbox::{DirEntry, sandbox_path};

use super::Runtime;
use crate::error::Result;

impl Runtime {
    /// Read a file from a sandbox.
    ///
    /// # Errors
    /// When the file does not exist or is a directory.
    pub async fn read_file(&self, agent: &AgentId, path: &str) -> Result<Vec<u8>> {
        Ok(self.sandbox.read_file(agent, path).await?)
    }

    /// Write (create or replace) a file in a sandbox, creating parent directories.
    ///
    /// # Errors
    /// When the path is not absolute or the engine fails.
    pub async fn write_file(&self, agent: &AgentId, path: &str, data: &[u8]) -> Result<()> {
        Ok(self.sandbox.write_file(agent, path, data).await?)
    }

    /// The entries of a directory in a sandbox (not `.` and `..`), sorted by name; a symlink to a
    /// directory lists the directory. The Docker runtime runs GNU `find` in the running sandbox.
    ///
    /// # Errors
    /// `BadInput` for a relative path, a `..` component, a NUL byte, or a path that is not a directory;
    /// `NotFound` when it does not exist.
    pub async fn list_dir(&self, agent: &AgentId, path: &str) -> Result<Vec<DirEntry>> {
        let path = sandbox_path(path)?;
        Ok(self.sandbox.list_dir(agent, &path).await?)
    }

    /// Remove a file, a symlink (not its target) or a directory with everything in it, from a running
    /// sandbox.
    ///
    /// # Errors
    /// `BadInput` for a path [`Runtime::list_dir`] refuses and for `/`; `NotFound` when it does not exist.
    pub async fn remove_path(&self, agent: &AgentId, path: &str) -> Result<()> {
        let path = sandbox_path(path)?;
        Ok(self.sandbox.remove_path(agent, &path).await?)
    }

    /// The canonical absolute path `path` names in the sandbox, every symlink resolved and components that
    /// do not exist kept (as `realpath -m`). Check this path, not the one given, before letting a caller
    /// read or write (S10): an agent can plant a symlink from an innocent name to a credential file.
    ///
    /// The Docker runtime asks the engine, which resolves in the container's filesystem and mounts, as its
    /// file reads and writes do; no program in the sandbox is run, since the agent could replace it. Works on
    /// a stopped sandbox too.
    ///
    /// # Errors
    /// `BadInput` for a path [`Runtime::list_dir`] refuses or too many symlinks; `NotFound` for an unknown
    /// sandbox.
    pub async fn resolve_path(&self, agent: &AgentId, path: &str) -> Result<String> {
        let path = sandbox_path(path)?;
        Ok(self.sandbox.resolve_path(agent, &path).await?)
    }
}
