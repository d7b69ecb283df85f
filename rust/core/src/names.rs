//! Unique names: a requested name is kept when free, otherwise a deterministic `_N` suffix is added.

use std::collections::{HashMap, HashSet};

// Every value and node name passes through these tables: foldhash instead of the default SipHash,
// which took ~15% of a conversion's instructions (callgrind, issue 13). Names are not an attack surface.
type Hasher = foldhash::fast::RandomState;

#[derive(Debug, Default, Clone)]
pub struct NameTable {
    used: HashSet<String, Hasher>,
    next_suffix: HashMap<String, usize, Hasher>,
}

impl NameTable {
    /// A table sized for `n` names.
    pub fn with_capacity(n: usize) -> Self {
        NameTable {
            used: HashSet::with_capacity_and_hasher(n, Hasher::default()),
            next_suffix: HashMap::default(),
        }
    }

    /// `unique` for a hint the caller owns: a free hint is kept, not copied.
    pub fn unique_owned(&mut self, hint: String) -> String {
        if hint.is_empty() || self.used.contains(&hint) {
            return self.unique(&hint);
        }
        self.used.insert(hint.clone());
        hint
    }

    /// `hint` itself when free, else `hint_1`, `hint_2`, … (the first free one); the result is reserved.
    pub fn unique(&mut self, hint: &str) -> String {
        let base = if hint.is_empty() { "v" } else { hint };
        if !self.used.contains(base) {
            self.used.insert(base.to_owned());
            return base.to_owned();
        }
        let counter = match self.next_suffix.get_mut(base) {
            Some(counter) => counter,
            None => self.next_suffix.entry(base.to_owned()).or_insert(1),
        };
        loop {
            let candidate = format!("{base}_{counter}");
            *counter += 1;
            if !self.used.contains(&candidate) {
                self.used.insert(candidate.clone());
                return candidate;
            }
        }
    }

    pub fn contains(&self, name: &str) -> bool {
        self.used.contains(name)
    }

    /// Marks a name as taken (used for names that must stay exactly as they are).
    pub fn reserve(&mut self, name: &str) -> bool {
        self.used.insert(name.to_owned())
    }

    pub fn len(&self) -> usize {
        self.used.len()
    }

    pub fn is_empty(&self) -> bool {
        self.used.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn free_names_are_kept_and_taken_ones_get_suffixes() {
        let mut t = NameTable::default();
        assert_eq!(t.unique("x"), "x");
        assert_eq!(t.unique("x"), "x_1");
        assert_eq!(t.unique("x_1"), "x_1_1");
        assert_eq!(t.unique("x"), "x_2");
        assert_eq!(t.unique(""), "v");
    }

    proptest! {
        #[test]
        fn names_never_collide(hints in proptest::collection::vec("[ab_1]{0,4}", 1..200)) {
            let mut t = NameTable::default();
            let mut seen = HashSet::new();
            for h in &hints {
                let n = t.unique(h);
                prop_assert!(seen.insert(n.clone()), "duplicate name {}", n);
            }
            prop_assert_eq!(t.len(), hints.len());
        }

        #[test]
        fn deterministic(hints in proptest::collection::vec("[ab_1]{0,3}", 1..50)) {
            let mut a = NameTable::default();
            let mut b = NameTable::default();
            for h in &hints {
                prop_assert_eq!(a.unique(h), b.unique_owned(h.clone()));
            }
        }
    }
}
