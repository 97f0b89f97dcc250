//! The snapshot's authorization policies: each kept with its compiled form
//! (compiled once, when the version enters a snapshot, on the control
//! thread), and indexed by the namespace they apply to ("" for global), the
//! DENY and ALLOW ones apart, so a core finds a workload's policies with four
//! probes (plus one per name the workload lists).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use super::table::Table;
use super::{find_named, merge_list, put_list, Builder, Named, Snapshot};
use crate::model::authz::{
    self, ByAction, CompiledPolicy, Conn, DryRun, Listed, PolicyTable, Selected, Verdict,
};
use crate::model::{Policy, UnreadablePolicy, Workload};
use crate::model::{PolicyAction, Str};

/// One policy version: the model value (None when the source could not
/// read it) and its compiled form.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct PolicyEntry {
    pub(super) policy: Option<Arc<Policy>>,
    pub(super) compiled: Arc<CompiledPolicy>,
}

impl PolicyEntry {
    pub(super) fn readable(policy: Policy) -> PolicyEntry {
        PolicyEntry {
            compiled: Arc::new(CompiledPolicy::compile(&policy)),
            policy: Some(Arc::new(policy)),
        }
    }

    pub(super) fn unreadable(p: &UnreadablePolicy) -> PolicyEntry {
        PolicyEntry {
            policy: None,
            compiled: Arc::new(CompiledPolicy::unreadable(p)),
        }
    }
}

/// Policies by key, for the names a workload lists.
impl PolicyTable for Table<Named<PolicyEntry>> {
    fn get(&self, key: &str) -> Option<&Arc<CompiledPolicy>> {
        find_named(self, key).map(|e| &e.compiled)
    }
}

/// Where [`Snapshot::policy_epoch`] values come from: unique across every
/// snapshot of the process, whichever source built it.
static POLICY_EPOCH: AtomicU64 = AtomicU64::new(1);

const NO_POLICIES: &[Listed] = &[];

impl Snapshot {
    /// By "ns/name"; None for an unknown or unreadable policy.
    pub fn policy(&self, key: &str) -> Option<&Arc<Policy>> {
        find_named(&self.policies, key).and_then(|e| e.policy.as_ref())
    }

    /// By "ns/name", readable or not: what the snapshot enforces under that
    /// name.
    pub fn compiled_policy(&self, key: &str) -> Option<&Arc<CompiledPolicy>> {
        find_named(&self.policies, key).map(|e| &e.compiled)
    }

    /// The readable policies, in no particular order.
    pub fn policies(&self) -> impl Iterator<Item = &Arc<Policy>> + '_ {
        self.policies.iter().filter_map(|e| e.value.policy.as_ref())
    }

    /// The policies the config source could not read (they deny where they
    /// apply), in no particular order.
    pub fn unreadable_policies(&self) -> impl Iterator<Item = &CompiledPolicy> + '_ {
        self.policies
            .iter()
            .filter(|e| e.value.policy.is_none())
            .map(|e| &*e.value.compiled)
    }

    /// How many policies, readable or not.
    pub fn policy_count(&self) -> usize {
        self.policies.len()
    }

    /// Changes whenever the set of policies does (0: no policy was ever
    /// added). Cores compare it to know whether open connections must be
    /// authorized again.
    pub fn policy_epoch(&self) -> u64 {
        self.policy_epoch
    }

    /// The policies that apply to `workload`: its namespace's, the global
    /// ones and those it names.
    pub fn policies_for<'s>(&'s self, workload: &'s Workload) -> Selected<'s> {
        let lists = |ns: &str| {
            let [deny, allow] = self
                .policies_by_namespace
                .each_ref()
                .map(|t| find_named(t, ns).map_or(NO_POLICIES, |l| &l[..]));
            ByAction { deny, allow }
        };
        Selected {
            // A workload always has a namespace; were it "", the global
            // lists must not be taken twice.
            namespace: if workload.namespace.is_empty() {
                ByAction::default()
            } else {
                lists(&workload.namespace)
            },
            global: lists(""),
            named: &workload.authorization_policies,
            table: &self.policies,
        }
    }

    /// Whether `workload` is subject to the very same policies here as in
    /// `other` (its namespace's and the global lists, and the policies it
    /// names): compared by identity, so no policy is read. A core uses it to
    /// skip open connections a new snapshot cannot concern.
    pub fn same_policies_for(&self, other: &Snapshot, workload: &Workload) -> bool {
        let same_lists = |ns: &str| {
            self.policies_by_namespace
                .iter()
                .zip(&other.policies_by_namespace)
                .all(|(a, b)| match (find_named(a, ns), find_named(b, ns)) {
                    (Some(a), Some(b)) => Arc::ptr_eq(a, b),
                    (None, None) => true,
                    _ => false,
                })
        };
        same_lists(&workload.namespace)
            && same_lists("")
            && workload.authorization_policies.iter().all(|key| {
                match (self.compiled_policy(key), other.compiled_policy(key)) {
                    (Some(a), Some(b)) => Arc::ptr_eq(a, b),
                    (None, None) => true,
                    _ => false,
                }
            })
    }

    /// Decides whether `conn` may reach `workload` (see [`authz`]).
    pub fn authorize<'s>(
        &'s self,
        workload: &'s Workload,
        conn: &Conn<'_>,
        dry_run: &mut dyn FnMut(DryRun<'s>),
    ) -> Verdict<'s> {
        authz::authorize(&self.policies_for(workload), conn, dry_run)
    }

    /// The names `workload` lists that this snapshot has no policy for
    /// (skipped when deciding; sources warn about them).
    pub fn missing_policies<'a>(&'a self, workload: &'a Workload) -> impl Iterator<Item = &'a str> {
        workload
            .authorization_policies
            .iter()
            .filter(|k| find_named(&self.policies, k).is_none())
            .map(Str::as_str)
    }
}

impl Builder {
    pub(super) fn put_policy(&mut self, key: Arc<str>, entry: PolicyEntry) {
        self.policies_changed = true;
        self.changed_policies.push(entry.compiled.clone());
        if let Some(old) = self.next.policies.insert(Named { key, value: entry }) {
            self.changed_policies.push(old.value.compiled);
        }
    }

    pub(super) fn remove_policy(&mut self, key: &str) {
        let t = &mut self.next.policies;
        if let Some(old) = t.remove(t.hash(key), |e| &*e.key == key) {
            self.policies_changed = true;
            self.changed_policies.push(old.value.compiled);
        }
    }

    /// Rebuilds the per-namespace lists the policy changes touched, and
    /// takes a new epoch if anything changed.
    pub(super) fn reindex_policies(&mut self) {
        if !self.policies_changed {
            return;
        }
        self.next.policy_epoch = POLICY_EPOCH.fetch_add(1, Ordering::Relaxed);
        let mut touched: Vec<(&str, &str)> = self
            .changed_policies
            .iter()
            .filter_map(|p| Some((p.index_namespace()?, p.key())))
            .collect();
        touched.sort_unstable();
        touched.dedup();
        let next = &mut self.next;
        for group in touched.chunk_by(|a, b| a.0 == b.0) {
            let ns = group[0].0;
            let keys: Vec<&str> = group.iter().map(|(_, key)| *key).collect();
            for (i, action) in [PolicyAction::Deny, PolicyAction::Allow]
                .into_iter()
                .enumerate()
            {
                let index = &next.policies_by_namespace[i];
                let list = merge_list(
                    find_named(index, ns).map_or(NO_POLICIES, |l| &l[..]),
                    &keys,
                    |l| l.policy().key(),
                    |key| {
                        find_named(&next.policies, key)
                            .map(|e| &e.compiled)
                            .filter(|p| p.index_namespace() == Some(ns) && p.action() == action)
                            .map(|p| Listed::new(p.clone()))
                    },
                );
                put_list(&mut next.policies_by_namespace[i], ns, list);
            }
        }
    }
}
