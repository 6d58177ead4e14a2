//! Compact sorted collections of atoms: the contents of a [`Datum`](crate::Datum).
//!
//! Almost every column value is a set of one atom (a scalar) or a small map. A B-tree holding
//! one element still allocates a whole leaf node, so a replica of thousands of rows spent most
//! of its decode time in the allocator. [`AtomSet`] keeps its atoms in a sorted, deduplicated
//! small vector whose first element lives inline (a scalar allocates nothing); [`AtomMap`]
//! keeps its entries in a vector sorted by key with unique keys. Both compare, order and hash
//! by their sorted contents, exactly as `BTreeSet<Atom>` / `BTreeMap<Atom, Atom>` do.

use std::cmp::Ordering;
use std::fmt;

use smallvec::SmallVec;

use crate::datum::Atom;

/// A set of atoms: sorted, without duplicates; one element is stored inline.
#[derive(Clone, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct AtomSet(SmallVec<[Atom; 1]>);

impl AtomSet {
    pub fn new() -> Self {
        AtomSet(SmallVec::new())
    }
    pub fn with_capacity(n: usize) -> Self {
        AtomSet(SmallVec::with_capacity(n))
    }
    /// The set holding only `a` (no allocation).
    pub fn single(a: Atom) -> Self {
        let mut v = SmallVec::new();
        v.push(a);
        AtomSet(v)
    }
    pub fn len(&self) -> usize {
        self.0.len()
    }
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
    pub fn iter(&self) -> std::slice::Iter<'_, Atom> {
        self.0.iter()
    }
    /// The atoms in ascending order.
    pub fn as_slice(&self) -> &[Atom] {
        &self.0
    }
    pub fn first(&self) -> Option<&Atom> {
        self.0.first()
    }
    pub fn last(&self) -> Option<&Atom> {
        self.0.last()
    }
    pub fn contains(&self, a: &Atom) -> bool {
        self.0.binary_search(a).is_ok()
    }
    /// Adds `a`; `false` when it was already present.
    pub fn insert(&mut self, a: Atom) -> bool {
        match self.0.binary_search(&a) {
            Ok(_) => false,
            Err(i) => {
                self.0.insert(i, a);
                true
            }
        }
    }
    /// Removes `a`; `false` when it was absent.
    pub fn remove(&mut self, a: &Atom) -> bool {
        match self.0.binary_search(a) {
            Ok(i) => {
                self.0.remove(i);
                true
            }
            Err(_) => false,
        }
    }
    /// Adds `a` when absent, removes it when present (the update2 set diff of one atom);
    /// returns whether `a` is in the set afterwards.
    pub fn toggle(&mut self, a: Atom) -> bool {
        match self.0.binary_search(&a) {
            Ok(i) => {
                self.0.remove(i);
                false
            }
            Err(i) => {
                self.0.insert(i, a);
                true
            }
        }
    }
    /// Toggles every atom of `diff`: the set becomes the symmetric difference of the two.
    ///
    /// A few atoms are toggled in place (a binary search each); a larger diff is merged in
    /// one pass, so the cost stays linear in the two sizes.
    pub fn toggle_all(&mut self, diff: AtomSet) {
        if self.is_empty() {
            *self = diff;
            return;
        }
        if diff.len() <= SMALL_DIFF {
            for a in diff {
                self.toggle(a);
            }
            return;
        }
        let old = std::mem::take(&mut self.0);
        let mut out = SmallVec::with_capacity(old.len() + diff.len());
        // An atom in both sets toggles off.
        merge_sorted(old, diff.0, |a| a, |_, _| None, &mut out);
        self.0 = out;
    }
    pub fn clear(&mut self) {
        self.0.clear();
    }
    pub fn retain(&mut self, mut keep: impl FnMut(&Atom) -> bool) {
        self.0.retain(|a| keep(a));
    }

    /// The set of `atoms`, given in any order and possibly repeated.
    pub(crate) fn from_unsorted(atoms: SmallVec<[Atom; 1]>) -> Self {
        let mut s = AtomSet(atoms);
        s.normalize();
        s
    }

    /// Restores the invariant after unsorted pushes.
    fn normalize(&mut self) {
        if self.0.windows(2).all(|w| w[0] < w[1]) {
            return;
        }
        self.0.sort_unstable();
        self.0.dedup();
        if self.0.len() <= 1 {
            // Duplicates of one atom: back to inline storage.
            self.0.shrink_to_fit();
        }
    }
}

/// Below this many atoms, a diff is applied one binary search at a time.
const SMALL_DIFF: usize = 4;

impl fmt::Debug for AtomSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_set().entries(self.iter()).finish()
    }
}

impl FromIterator<Atom> for AtomSet {
    fn from_iter<I: IntoIterator<Item = Atom>>(iter: I) -> Self {
        AtomSet::from_unsorted(iter.into_iter().collect())
    }
}

impl Extend<Atom> for AtomSet {
    fn extend<I: IntoIterator<Item = Atom>>(&mut self, iter: I) {
        self.0.extend(iter);
        self.normalize();
    }
}

impl<'a> Extend<&'a Atom> for AtomSet {
    fn extend<I: IntoIterator<Item = &'a Atom>>(&mut self, iter: I) {
        self.extend(iter.into_iter().cloned());
    }
}

impl IntoIterator for AtomSet {
    type Item = Atom;
    type IntoIter = smallvec::IntoIter<[Atom; 1]>;
    fn into_iter(self) -> Self::IntoIter {
        self.0.into_iter()
    }
}

impl<'a> IntoIterator for &'a AtomSet {
    type Item = &'a Atom;
    type IntoIter = std::slice::Iter<'a, Atom>;
    fn into_iter(self) -> Self::IntoIter {
        self.0.iter()
    }
}

impl<const N: usize> From<[Atom; N]> for AtomSet {
    fn from(atoms: [Atom; N]) -> Self {
        atoms.into_iter().collect()
    }
}

impl From<std::collections::BTreeSet<Atom>> for AtomSet {
    fn from(s: std::collections::BTreeSet<Atom>) -> Self {
        // Already sorted and unique.
        AtomSet(s.into_iter().collect())
    }
}

impl serde::Serialize for AtomSet {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_seq(self.iter())
    }
}

/// A map between atoms: entries sorted by key, keys unique.
#[derive(Clone, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct AtomMap(Vec<(Atom, Atom)>);

impl AtomMap {
    pub const fn new() -> Self {
        AtomMap(Vec::new())
    }
    pub fn with_capacity(n: usize) -> Self {
        AtomMap(Vec::with_capacity(n))
    }
    pub fn len(&self) -> usize {
        self.0.len()
    }
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
    /// The entries in ascending key order.
    pub fn iter(&self) -> Iter<'_> {
        Iter(self.0.iter())
    }
    pub fn keys(&self) -> impl DoubleEndedIterator<Item = &Atom> + ExactSizeIterator {
        self.0.iter().map(|(k, _)| k)
    }
    pub fn values(&self) -> impl DoubleEndedIterator<Item = &Atom> + ExactSizeIterator {
        self.0.iter().map(|(_, v)| v)
    }
    /// The entries in ascending key order.
    pub fn as_slice(&self) -> &[(Atom, Atom)] {
        &self.0
    }
    pub fn first_key_value(&self) -> Option<(&Atom, &Atom)> {
        self.0.first().map(|(k, v)| (k, v))
    }
    pub fn last_key_value(&self) -> Option<(&Atom, &Atom)> {
        self.0.last().map(|(k, v)| (k, v))
    }
    fn find(&self, k: &Atom) -> Result<usize, usize> {
        self.0.binary_search_by(|(x, _)| x.cmp(k))
    }
    pub fn contains_key(&self, k: &Atom) -> bool {
        self.find(k).is_ok()
    }
    pub fn get(&self, k: &Atom) -> Option<&Atom> {
        self.find(k).ok().map(|i| &self.0[i].1)
    }
    pub fn get_mut(&mut self, k: &Atom) -> Option<&mut Atom> {
        self.find(k).ok().map(|i| &mut self.0[i].1)
    }
    /// The value under the string key `k`, without building an [`Atom`] to probe with.
    pub fn get_str(&self, k: &str) -> Option<&Atom> {
        self.0
            .binary_search_by(|(x, _)| cmp_atom_str(x, k))
            .ok()
            .map(|i| &self.0[i].1)
    }
    /// Sets `k` to `v`, returning the value it replaces.
    pub fn insert(&mut self, k: Atom, v: Atom) -> Option<Atom> {
        match self.find(&k) {
            Ok(i) => Some(std::mem::replace(&mut self.0[i].1, v)),
            Err(i) => {
                self.0.insert(i, (k, v));
                None
            }
        }
    }
    /// Removes `k`, returning its value.
    pub fn remove(&mut self, k: &Atom) -> Option<Atom> {
        self.find(k).ok().map(|i| self.0.remove(i).1)
    }
    /// Applies one entry of an update2 map diff: a new key is inserted, a key given with its
    /// current value is removed, a key given with another value takes that value.
    pub fn apply_diff_entry(&mut self, k: Atom, v: Atom) {
        match self.find(&k) {
            Ok(i) if self.0[i].1 == v => {
                self.0.remove(i);
            }
            Ok(i) => self.0[i].1 = v,
            Err(i) => self.0.insert(i, (k, v)),
        }
    }
    /// Applies every entry of an update2 map diff (see [`apply_diff_entry`](Self::apply_diff_entry)).
    ///
    /// A few entries are applied in place (a binary search each); a larger diff is merged in
    /// one pass, so the cost stays linear in the two sizes.
    pub fn apply_diff(&mut self, diff: AtomMap) {
        if self.is_empty() {
            *self = diff;
            return;
        }
        if diff.len() <= SMALL_DIFF {
            for (k, v) in diff {
                self.apply_diff_entry(k, v);
            }
            return;
        }
        let old = std::mem::take(&mut self.0);
        let mut out = Vec::with_capacity(old.len() + diff.len());
        // A key given with its current value is deleted, with another value replaced.
        merge_sorted(
            old,
            diff.0,
            |e| &e.0,
            |cur, new| (cur.1 != new.1).then_some(new),
            &mut out,
        );
        self.0 = out;
    }
    pub fn clear(&mut self) {
        self.0.clear();
    }
    pub fn retain(&mut self, mut keep: impl FnMut(&Atom, &mut Atom) -> bool) {
        self.0.retain_mut(|(k, v)| keep(k, v));
    }

    /// The map of `entries`, given in any order; of a repeated key the last value is kept.
    pub(crate) fn from_unsorted(entries: Vec<(Atom, Atom)>) -> Self {
        let mut m = AtomMap(entries);
        m.normalize();
        m
    }

    /// Restores the invariant after unsorted pushes: sorts by key (stably) and keeps the last
    /// value given for a key, as inserting the entries one by one into a map would.
    fn normalize(&mut self) {
        if self.0.windows(2).all(|w| w[0].0 < w[1].0) {
            return;
        }
        self.0.sort_by(|x, y| x.0.cmp(&y.0));
        // `dedup_by` keeps the first of equal neighbours: move the later value into it.
        self.0.dedup_by(|later, kept| {
            if later.0 == kept.0 {
                std::mem::swap(&mut later.1, &mut kept.1);
                true
            } else {
                false
            }
        });
    }
}

/// How `a` orders against `Atom::String(s)`, without building that atom.
fn cmp_atom_str(a: &Atom, s: &str) -> Ordering {
    match a {
        Atom::String(x) => x.as_str().cmp(s),
        // Variants order by declaration: these come before strings, the others after.
        Atom::Integer(_) | Atom::Real(_) | Atom::Boolean(_) => Ordering::Less,
        Atom::Uuid(_) | Atom::NamedUuid(_) => Ordering::Greater,
    }
}

impl fmt::Debug for AtomMap {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_map().entries(self.iter()).finish()
    }
}

impl FromIterator<(Atom, Atom)> for AtomMap {
    fn from_iter<I: IntoIterator<Item = (Atom, Atom)>>(iter: I) -> Self {
        AtomMap::from_unsorted(iter.into_iter().collect())
    }
}

impl Extend<(Atom, Atom)> for AtomMap {
    fn extend<I: IntoIterator<Item = (Atom, Atom)>>(&mut self, iter: I) {
        self.0.extend(iter);
        self.normalize();
    }
}

impl IntoIterator for AtomMap {
    type Item = (Atom, Atom);
    type IntoIter = std::vec::IntoIter<(Atom, Atom)>;
    fn into_iter(self) -> Self::IntoIter {
        self.0.into_iter()
    }
}

impl<'a> IntoIterator for &'a AtomMap {
    type Item = (&'a Atom, &'a Atom);
    type IntoIter = Iter<'a>;
    fn into_iter(self) -> Self::IntoIter {
        self.iter()
    }
}

impl<const N: usize> From<[(Atom, Atom); N]> for AtomMap {
    fn from(entries: [(Atom, Atom); N]) -> Self {
        entries.into_iter().collect()
    }
}

impl From<std::collections::BTreeMap<Atom, Atom>> for AtomMap {
    fn from(m: std::collections::BTreeMap<Atom, Atom>) -> Self {
        // Already sorted with unique keys.
        AtomMap(m.into_iter().collect())
    }
}

/// The entries of an [`AtomMap`] by reference, in ascending key order.
#[derive(Clone, Debug)]
pub struct Iter<'a>(std::slice::Iter<'a, (Atom, Atom)>);

impl<'a> Iterator for Iter<'a> {
    type Item = (&'a Atom, &'a Atom);
    fn next(&mut self) -> Option<Self::Item> {
        self.0.next().map(|(k, v)| (k, v))
    }
    fn size_hint(&self) -> (usize, Option<usize>) {
        self.0.size_hint()
    }
}

impl DoubleEndedIterator for Iter<'_> {
    fn next_back(&mut self) -> Option<Self::Item> {
        self.0.next_back().map(|(k, v)| (k, v))
    }
}

impl ExactSizeIterator for Iter<'_> {}

/// Merges `old` and `diff`, both sorted by `key` with unique keys, into `out` in key order:
/// an entry on one side only is kept; for a key on both sides `both(old, new)` decides what
/// stays. One pass, linear in the two sizes.
fn merge_sorted<T, K: Ord>(
    old: impl IntoIterator<Item = T>,
    diff: impl IntoIterator<Item = T>,
    key: impl for<'x> Fn(&'x T) -> &'x K,
    mut both: impl FnMut(T, T) -> Option<T>,
    out: &mut impl Extend<T>,
) {
    let mut a = old.into_iter().peekable();
    let mut b = diff.into_iter().peekable();
    loop {
        let ord = match (a.peek(), b.peek()) {
            (Some(x), Some(y)) => key(x).cmp(key(y)),
            (Some(_), None) => Ordering::Less,
            (None, Some(_)) => Ordering::Greater,
            (None, None) => break,
        };
        match ord {
            Ordering::Less => out.extend(a.next()),
            Ordering::Greater => out.extend(b.next()),
            Ordering::Equal => {
                if let (Some(cur), Some(new)) = (a.next(), b.next()) {
                    out.extend(both(cur, new));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::datum::Real;
    use proptest::prelude::*;
    use std::collections::{BTreeMap, BTreeSet};
    use std::hash::{BuildHasher, Hash, RandomState};

    /// Few distinct atoms of every kind, so operations hit existing elements often.
    fn arb_atom() -> impl Strategy<Value = Atom> {
        prop_oneof![
            (-3i64..3).prop_map(Atom::Integer),
            (-2i32..2).prop_map(|f| Atom::Real(Real(f as f64 / 2.0))),
            any::<bool>().prop_map(Atom::Boolean),
            "[a-d]{0,2}".prop_map(Atom::String),
            (0u128..4).prop_map(|u| Atom::Uuid(uuid::Uuid::from_u128(u))),
            "[xy]".prop_map(Atom::NamedUuid),
        ]
    }

    #[derive(Clone, Debug)]
    enum SetOp {
        Insert(Atom),
        Remove(Atom),
        Toggle(Atom),
        ToggleAll(Vec<Atom>),
        Extend(Vec<Atom>),
        Retain(Atom),
    }

    fn arb_set_op() -> impl Strategy<Value = SetOp> {
        let atoms = || proptest::collection::vec(arb_atom(), 0..12);
        prop_oneof![
            arb_atom().prop_map(SetOp::Insert),
            arb_atom().prop_map(SetOp::Remove),
            arb_atom().prop_map(SetOp::Toggle),
            atoms().prop_map(SetOp::ToggleAll),
            atoms().prop_map(SetOp::Extend),
            arb_atom().prop_map(SetOp::Retain),
        ]
    }

    #[derive(Clone, Debug)]
    enum MapOp {
        Insert(Atom, Atom),
        Remove(Atom),
        DiffEntry(Atom, Atom),
        Diff(Vec<(Atom, Atom)>),
        Extend(Vec<(Atom, Atom)>),
        Retain(Atom),
    }

    fn arb_map_op() -> impl Strategy<Value = MapOp> {
        let pairs = || proptest::collection::vec((arb_atom(), arb_atom()), 0..12);
        prop_oneof![
            (arb_atom(), arb_atom()).prop_map(|(k, v)| MapOp::Insert(k, v)),
            arb_atom().prop_map(MapOp::Remove),
            (arb_atom(), arb_atom()).prop_map(|(k, v)| MapOp::DiffEntry(k, v)),
            pairs().prop_map(MapOp::Diff),
            pairs().prop_map(MapOp::Extend),
            arb_atom().prop_map(MapOp::Retain),
        ]
    }

    /// The update2 map diff applied to the model, one entry at a time.
    fn model_map_diff(m: &mut BTreeMap<Atom, Atom>, k: Atom, v: Atom) {
        if m.get(&k) == Some(&v) {
            m.remove(&k);
        } else {
            m.insert(k, v);
        }
    }

    fn check_set(s: &AtomSet, model: &BTreeSet<Atom>) -> Result<(), TestCaseError> {
        prop_assert_eq!(s.len(), model.len());
        prop_assert_eq!(s.is_empty(), model.is_empty());
        prop_assert!(s.iter().eq(model.iter()));
        prop_assert_eq!(s.first(), model.first());
        prop_assert_eq!(s.last(), model.last());
        prop_assert_eq!(format!("{s:?}"), format!("{model:?}"));
        Ok(())
    }

    fn check_map(m: &AtomMap, model: &BTreeMap<Atom, Atom>) -> Result<(), TestCaseError> {
        prop_assert_eq!(m.len(), model.len());
        prop_assert!(m.iter().eq(model.iter()));
        prop_assert!(m.keys().eq(model.keys()));
        prop_assert!(m.values().eq(model.values()));
        prop_assert!(m.iter().rev().eq(model.iter().rev()));
        prop_assert_eq!(m.first_key_value(), model.first_key_value());
        prop_assert_eq!(format!("{m:?}"), format!("{model:?}"));
        for (k, v) in model {
            prop_assert_eq!(m.get(k), Some(v));
            if let Atom::String(s) = k {
                prop_assert_eq!(m.get_str(s), Some(v));
            }
        }
        Ok(())
    }

    proptest! {
        #[test]
        fn set_behaves_like_a_btreeset(
            init in proptest::collection::vec(arb_atom(), 0..10),
            ops in proptest::collection::vec(arb_set_op(), 0..40),
            probes in proptest::collection::vec(arb_atom(), 0..8),
        ) {
            // FromIterator with duplicates and in any order.
            let mut s: AtomSet = init.iter().cloned().collect();
            let mut model: BTreeSet<Atom> = init.into_iter().collect();
            check_set(&s, &model)?;
            for op in ops {
                match op {
                    SetOp::Insert(a) => prop_assert_eq!(s.insert(a.clone()), model.insert(a)),
                    SetOp::Remove(a) => prop_assert_eq!(s.remove(&a), model.remove(&a)),
                    SetOp::Toggle(a) => {
                        let present = if model.remove(&a) { false } else { model.insert(a.clone()) };
                        prop_assert_eq!(s.toggle(a), present);
                    }
                    SetOp::ToggleAll(d) => {
                        // A diff is itself a set.
                        let d: AtomSet = d.into_iter().collect();
                        for a in &d {
                            if !model.remove(a) {
                                model.insert(a.clone());
                            }
                        }
                        s.toggle_all(d);
                    }
                    SetOp::Extend(d) => {
                        s.extend(d.iter());
                        model.extend(d);
                    }
                    SetOp::Retain(p) => {
                        s.retain(|a| a < &p);
                        model.retain(|a| a < &p);
                    }
                }
                check_set(&s, &model)?;
            }
            for p in &probes {
                prop_assert_eq!(s.contains(p), model.contains(p));
            }
            let owned: Vec<Atom> = s.clone().into_iter().collect();
            prop_assert!(owned.iter().eq(model.iter()));
            prop_assert_eq!(AtomSet::from(model.clone()), s);
        }

        #[test]
        fn map_behaves_like_a_btreemap(
            init in proptest::collection::vec((arb_atom(), arb_atom()), 0..10),
            ops in proptest::collection::vec(arb_map_op(), 0..40),
            probes in proptest::collection::vec(arb_atom(), 0..8),
        ) {
            // FromIterator with duplicated keys: the last value wins.
            let mut m: AtomMap = init.iter().cloned().collect();
            let mut model: BTreeMap<Atom, Atom> = init.into_iter().collect();
            check_map(&m, &model)?;
            for op in ops {
                match op {
                    MapOp::Insert(k, v) => {
                        prop_assert_eq!(m.insert(k.clone(), v.clone()), model.insert(k, v));
                    }
                    MapOp::Remove(k) => prop_assert_eq!(m.remove(&k), model.remove(&k)),
                    MapOp::DiffEntry(k, v) => {
                        m.apply_diff_entry(k.clone(), v.clone());
                        model_map_diff(&mut model, k, v);
                    }
                    MapOp::Diff(d) => {
                        // A diff is itself a map.
                        let d: AtomMap = d.into_iter().collect();
                        for (k, v) in &d {
                            model_map_diff(&mut model, k.clone(), v.clone());
                        }
                        m.apply_diff(d);
                    }
                    MapOp::Extend(d) => {
                        m.extend(d.iter().cloned());
                        model.extend(d);
                    }
                    MapOp::Retain(p) => {
                        m.retain(|k, _| k < &p);
                        model.retain(|k, _| k < &p);
                    }
                }
                check_map(&m, &model)?;
            }
            for p in &probes {
                prop_assert_eq!(m.contains_key(p), model.contains_key(p));
                prop_assert_eq!(m.get(p), model.get(p));
                if let Atom::String(s) = p {
                    prop_assert_eq!(m.get_str(s), model.get(p));
                }
            }
            let owned: Vec<(Atom, Atom)> = m.clone().into_iter().collect();
            prop_assert!(owned.into_iter().eq(model.clone()));
            prop_assert_eq!(AtomMap::from(model.clone()), m);
        }

        #[test]
        fn sets_compare_like_btreesets(
            a in proptest::collection::vec(arb_atom(), 0..5),
            b in proptest::collection::vec(arb_atom(), 0..5),
        ) {
            let (sa, sb): (AtomSet, AtomSet) = (a.iter().cloned().collect(), b.iter().cloned().collect());
            let (ma, mb): (BTreeSet<Atom>, BTreeSet<Atom>) = (a.into_iter().collect(), b.into_iter().collect());
            compares_like(&sa, &sb, &ma, &mb)?;
        }

        #[test]
        fn maps_compare_like_btreemaps(
            a in proptest::collection::vec((arb_atom(), arb_atom()), 0..5),
            b in proptest::collection::vec((arb_atom(), arb_atom()), 0..5),
        ) {
            let (sa, sb): (AtomMap, AtomMap) = (a.iter().cloned().collect(), b.iter().cloned().collect());
            let (ma, mb): (BTreeMap<Atom, Atom>, BTreeMap<Atom, Atom>) =
                (a.into_iter().collect(), b.into_iter().collect());
            compares_like(&sa, &sb, &ma, &mb)?;
        }
    }

    /// `(sa, sb)` compare, order and hash as their B-tree models `(ma, mb)` do.
    fn compares_like<S: Ord + Hash, M: Ord>(
        sa: &S,
        sb: &S,
        ma: &M,
        mb: &M,
    ) -> Result<(), TestCaseError> {
        prop_assert_eq!(sa == sb, ma == mb);
        prop_assert_eq!(sa.cmp(sb), ma.cmp(mb));
        prop_assert_eq!(sa.partial_cmp(sb), ma.partial_cmp(mb));
        if sa == sb {
            let h = RandomState::new();
            prop_assert_eq!(h.hash_one(sa), h.hash_one(sb));
        }
        Ok(())
    }

    #[test]
    fn a_scalar_is_stored_inline() {
        let s = AtomSet::single(Atom::from("x"));
        assert!(!s.0.spilled());
        let s: AtomSet = [Atom::from(1), Atom::from(1)].into();
        assert!(!s.0.spilled());
        assert_eq!(s.len(), 1);
    }

    #[test]
    fn string_probe_orders_like_atoms() {
        let m = AtomMap::from([
            (Atom::Integer(5), Atom::from("i")),
            (Atom::Boolean(true), Atom::from("b")),
            (Atom::from("k"), Atom::from("v")),
            (Atom::Uuid(uuid::Uuid::nil()), Atom::from("u")),
            (Atom::NamedUuid("k".into()), Atom::from("n")),
        ]);
        assert_eq!(m.get_str("k"), Some(&Atom::from("v")));
        assert_eq!(m.get_str("i"), None);
    }
}
