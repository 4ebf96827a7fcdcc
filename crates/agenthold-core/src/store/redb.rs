//! The default [`Store`](super::Store) on redb.
// Implementation pending (issue 2, item 6).

/// A [`Store`](super::Store) on a redb database file.
#[derive(Debug)]
pub struct RedbStore {}
