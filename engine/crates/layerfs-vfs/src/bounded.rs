//! A map that holds at most a given number of entries and, when full,
//! starts over: everything it held is forgotten at once.
//!
//! For caches whose entries are cheap to make again, where keeping an order
//! of use would cost every lookup more than a rare refill costs. The bound
//! is what matters: a client (a kernel, a program, a remote caller) that
//! names ever new keys must not grow the map without end.

use std::collections::HashMap;
use std::hash::{BuildHasher, Hash};
use std::ops::Deref;

pub struct BoundedMap<K, V, S = std::hash::RandomState> {
    map: HashMap<K, V, S>,
    bound: usize,
}

impl<K: Hash + Eq, V, S: BuildHasher + Default> BoundedMap<K, V, S> {
    /// A map of at most `bound` entries (at least one).
    pub fn new(bound: usize) -> Self {
        BoundedMap {
            map: HashMap::default(),
            bound: bound.max(1),
        }
    }

    /// Makes room for `key`: when the map is full and `key` is not in it,
    /// takes everything out and hands it back (for what must be done with
    /// what is dropped).
    pub fn make_room(&mut self, key: &K) -> Option<HashMap<K, V, S>> {
        if self.map.len() >= self.bound && !self.map.contains_key(key) {
            return Some(std::mem::take(&mut self.map));
        }
        None
    }

    /// Keeps `value` for `key`, starting over first if full; the value
    /// `key` had.
    pub fn insert(&mut self, key: K, value: V) -> Option<V> {
        self.make_room(&key);
        self.map.insert(key, value)
    }

    pub fn get_mut(&mut self, key: &K) -> Option<&mut V> {
        self.map.get_mut(key)
    }

    pub fn values_mut(&mut self) -> std::collections::hash_map::ValuesMut<'_, K, V> {
        self.map.values_mut()
    }

    pub fn remove(&mut self, key: &K) -> Option<V> {
        self.map.remove(key)
    }

    pub fn clear(&mut self) {
        self.map.clear();
    }
}

/// Reads go to the map itself; changes go through the methods above, which
/// keep the bound.
impl<K, V, S> Deref for BoundedMap<K, V, S> {
    type Target = HashMap<K, V, S>;

    fn deref(&self) -> &HashMap<K, V, S> {
        &self.map
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_full_map_starts_over_for_a_new_key_only() {
        let mut m: BoundedMap<u32, u32> = BoundedMap::new(3);
        for k in 0..3 {
            assert_eq!(m.insert(k, k), None);
        }
        // A key it holds is replaced, nothing dropped.
        assert_eq!(m.insert(1, 10), Some(1));
        assert_eq!(m.len(), 3);
        assert!(m.make_room(&2).is_none());
        // A new one: the three go, and are handed back.
        let dropped = m.make_room(&7).unwrap();
        assert_eq!(dropped.len(), 3);
        assert_eq!(dropped[&1], 10);
        assert!(m.is_empty());
        m.insert(7, 7);
        for k in 8..100 {
            m.insert(k, k);
            assert!(m.len() <= 3);
        }
        assert_eq!(m.get(&99), Some(&99));
        assert_eq!(m.remove(&99), Some(99));
        // A bound of zero still keeps the last.
        let mut one: BoundedMap<u32, ()> = BoundedMap::new(0);
        one.insert(1, ());
        one.insert(2, ());
        assert_eq!(one.keys().collect::<Vec<_>>(), [&2]);
    }
}
