//! Where nodes come from: one entry per source of nodes (in fastonnx, one FX node), holding the prefix
//! of the readable names of the nodes made from it (`/model/layers.0/self_attn/q_proj`) and the
//! `metadata_props` they carry. A converter emits several ONNX nodes per FX node, so the entries are
//! interned once in a table shared by a graph and its subgraphs, and each node holds an index into it
//! (four bytes per node instead of five strings).

use std::sync::{Arc, Mutex, MutexGuard};

/// One entry: the name prefix and the (key, value) metadata of the nodes made in it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Scope {
    /// Node names in this scope read `{prefix}/{op_type}` (`/MatMul` at the top level, whose prefix
    /// is empty).
    pub prefix: String,
    /// `NodeProto.metadata_props`, in this order.
    pub props: Vec<(String, String)>,
}

/// The table, shared (like names) by a graph and its subgraphs, so that an index means the same
/// scope in every body of an If / Loop / Scan.
#[derive(Debug, Default, Clone)]
pub struct SharedScopes(Arc<Mutex<Vec<Arc<Scope>>>>);

impl SharedScopes {
    fn lock(&self) -> MutexGuard<'_, Vec<Arc<Scope>>> {
        // entries are only ever pushed whole: a panic elsewhere cannot leave one half-written
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Adds a scope; returns its index.
    pub fn add(&self, scope: Scope) -> u32 {
        self.add_shared(Arc::new(scope))
    }

    /// Adds a scope the caller keeps a handle on; returns its index.
    pub fn add_shared(&self, scope: Arc<Scope>) -> u32 {
        let mut table = self.lock();
        let index = u32::try_from(table.len()).unwrap_or(u32::MAX);
        table.push(scope);
        index
    }

    /// Adds `count` scopes without prefix or metadata (one lock); returns the first one's index.
    pub fn add_bare(&self, count: usize) -> u32 {
        let mut table = self.lock();
        let first = u32::try_from(table.len()).unwrap_or(u32::MAX);
        table.extend((0..count).map(|_| Arc::new(Scope::default())));
        first
    }

    /// Gives scope `index` the metadata `props` (its prefix stays); false when out of range.
    pub fn set_props(&self, index: u32, props: Vec<(String, String)>) -> bool {
        self.update(index, |scope| scope.props = props)
    }

    /// Gives scope `index` the name prefix `prefix` (its metadata stays); false when out of range.
    /// fastonnx adds the scopes of FX nodes bare as it walks the graph and gives them their prefix and
    /// metadata off the walk, alongside the passes (names then come from `Model::name_nodes_by_scope`).
    pub fn set_prefix(&self, index: u32, prefix: String) -> bool {
        self.update(index, |scope| scope.prefix = prefix)
    }

    /// Changes scope `index` in place, or a copy of it when a graph still holds the entry (the scope
    /// it makes nodes in); false when out of range.
    fn update(&self, index: u32, change: impl FnOnce(&mut Scope)) -> bool {
        let mut table = self.lock();
        let Some(entry) = table.get_mut(index as usize) else {
            return false;
        };
        change(Arc::make_mut(entry));
        true
    }

    /// The scope at `index` (None when out of range).
    pub fn get(&self, index: u32) -> Option<Arc<Scope>> {
        self.lock().get(index as usize).cloned()
    }

    /// Every scope, for the writer (one lock per graph written, not per node).
    pub fn snapshot(&self) -> Vec<Arc<Scope>> {
        self.lock().clone()
    }

    pub fn len(&self) -> usize {
        self.lock().len()
    }

    pub fn is_empty(&self) -> bool {
        self.lock().is_empty()
    }
}

/// The name of a node of `op_type` made in `scope`: `{prefix}/{op_type}`; the op type alone outside
/// any scope.
pub fn node_name_hint(scope: Option<&Scope>, op_type: &str) -> String {
    match scope {
        Some(s) => {
            let mut name = String::with_capacity(s.prefix.len() + 1 + op_type.len());
            name.push_str(&s.prefix);
            name.push('/');
            name.push_str(op_type);
            name
        }
        None => op_type.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scopes_are_shared_and_indexed() {
        let a = SharedScopes::default();
        let b = a.clone();
        let i = a.add(Scope {
            prefix: "/model/fc".into(),
            props: vec![("namespace".into(), "fc: Linear".into())],
        });
        assert_eq!(i, 0);
        assert_eq!(b.get(0).expect("shared").prefix, "/model/fc");
        assert!(b.get(1).is_none());
        assert_eq!(
            node_name_hint(b.get(0).as_deref(), "MatMul"),
            "/model/fc/MatMul"
        );
        assert_eq!(node_name_hint(None, "MatMul"), "MatMul");
        assert!(b.set_props(0, vec![("k".into(), "v".into())]));
        let scope = a.get(0).expect("set");
        assert_eq!((scope.prefix.as_str(), scope.props.len()), ("/model/fc", 1));
        assert!(!b.set_props(1, Vec::new()), "out of range");
        let top = Scope::default();
        assert_eq!(node_name_hint(Some(&top), "Add"), "/Add");
    }
}
