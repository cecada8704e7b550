//! Recording and alerting rules, as Prometheus runs them: rule files (`file`), alert templates
//! (`template`), alert states (`alerting`), group evaluation (`group`) and delivery to
//! Alertmanager (`notifier`).
//!
//! Each group runs on its own schedule: every `interval`, at a phase fixed by its file and name
//! (so a restart keeps it), its rules are evaluated in order by the server's PromQL engine with
//! the same limits as `/api/v1/query`, and the results are written through the head's
//! appender. A reload keeps groups whose definition did not change running untouched; a
//! changed group takes over the alerts and series of its unchanged rules; a removed rule or
//! group has its series marked stale. `docs/rules.md` has the user's view.

pub mod alerting;
pub mod file;
pub mod group;
pub mod notifier;
pub mod template;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;

pub use file::{GroupDef, LoadOptions, RuleDef, RuleKind};
pub use group::{Env, GroupState, Health, RuleOptions, RuleQuerier};
use notifier::Notifier;

use crate::scrape::scrape_loop::now_ms;

/// A running group.
struct Running {
    state: Arc<Mutex<GroupState>>,
    /// Held for the whole of each evaluation, so a reload can wait for one in progress.
    evaluating: Arc<Mutex<()>>,
    stop: tokio::sync::watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
}

impl Running {
    /// Stops the loop and waits for an evaluation in progress to end (its writes landed): then
    /// its state is final, to copy or to mark stale. Called on blocking threads (reloads).
    fn stop_and_wait(&self) {
        let _ = self.stop.send(true);
        self.task.abort();
        drop(self.evaluating.lock());
    }
}

/// The rule groups in force and their evaluation loops.
pub struct RuleManager {
    env: Arc<Env>,
    rt: tokio::runtime::Handle,
    groups: Mutex<Vec<Running>>,
    /// Set once the first set of groups is applied: only groups loaded at start restore their
    /// alerts' `for` state.
    started: Mutex<bool>,
}

impl std::fmt::Debug for RuleManager {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RuleManager").field("groups", &self.groups.lock().len()).finish()
    }
}

impl RuleManager {
    pub fn new(env: Env, rt: tokio::runtime::Handle) -> Arc<RuleManager> {
        Arc::new(RuleManager { env: Arc::new(env), rt, groups: Mutex::new(Vec::new()), started: Mutex::new(false) })
    }

    pub fn notifier(&self) -> &Arc<Notifier> {
        &self.env.notifier
    }

    pub fn set_external_labels(&self, labels: BTreeMap<String, String>) {
        *self.env.external_labels.lock() = labels;
    }

    /// Puts `defs` in force (start and reload).
    pub fn apply(&self, defs: Vec<GroupDef>) {
        let first = {
            let mut s = self.started.lock();
            let first = !*s;
            *s = true;
            first
        };
        let mut old: Vec<Running> = std::mem::take(&mut *self.groups.lock());
        let mut next = Vec::with_capacity(defs.len());
        let mut stale = Vec::new();
        for def in defs {
            let same = old.iter().position(|r| {
                let s = r.state.lock();
                s.def.file == def.file && s.def.name == def.name
            });
            match same {
                Some(i) if *old[i].state.lock().def == def => next.push(old.swap_remove(i)),
                Some(i) => {
                    let prev = old.swap_remove(i);
                    prev.stop_and_wait();
                    let mut state = GroupState::new(def, false);
                    stale.extend(state.copy_state(&mut prev.state.lock()));
                    next.push(self.start(state));
                }
                None => next.push(self.start(GroupState::new(def, first))),
            }
        }
        for gone in old {
            gone.stop_and_wait();
            stale.extend(gone.state.lock().all_series());
        }
        if !stale.is_empty() {
            let db = self.env.db.clone();
            let t = now_ms();
            // Not on an async worker: the appender may wait for the disk.
            self.rt.spawn_blocking(move || group::mark_stale(&db, &stale, t));
        }
        *self.groups.lock() = next;
    }

    fn start(&self, state: GroupState) -> Running {
        let (stop, stop_rx) = tokio::sync::watch::channel(false);
        let state = Arc::new(Mutex::new(state));
        let evaluating = Arc::new(Mutex::new(()));
        let task = self.rt.spawn(run_group(self.env.clone(), state.clone(), evaluating.clone(), stop_rx));
        Running { state, evaluating, stop, task }
    }

    /// Stops every group (shutdown; without waiting for an evaluation in progress, which ends
    /// by itself); their series are not marked stale.
    pub fn stop(&self) {
        for g in self.groups.lock().drain(..) {
            let _ = g.stop.send(true);
            g.task.abort();
        }
    }

    /// The groups' states, for the API and `/metrics`.
    pub fn groups(&self) -> Vec<Arc<Mutex<GroupState>>> {
        self.groups.lock().iter().map(|g| g.state.clone()).collect()
    }
}

/// A group's loop: waits for each evaluation time and evaluates on a blocking thread. An
/// evaluation that overran its interval skips the times it missed (counted), as Prometheus.
async fn run_group(
    env: Arc<Env>,
    state: Arc<Mutex<GroupState>>,
    evaluating: Arc<Mutex<()>>,
    mut stop: tokio::sync::watch::Receiver<bool>,
) {
    let (interval, offset) = {
        let s = state.lock();
        (s.def.interval_ms, group::group_offset(&s.def))
    };
    let mut next = group::eval_timestamp(now_ms(), interval, offset) + interval;
    loop {
        let wait = (next - now_ms()).max(0) as u64;
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_millis(wait)) => {}
            _ = stop.changed() => return,
        }
        if *stop.borrow() {
            return;
        }
        let (env2, state2, evaluating2) = (env.clone(), state.clone(), evaluating.clone());
        let ts = next;
        let eval = move || {
            let _evaluating = evaluating2.lock();
            group::eval_group(&env2, &state2, ts)
        };
        if tokio::task::spawn_blocking(eval).await.is_err() {
            tracing::error!("rule group evaluation panicked");
        }
        next += interval;
        let now = now_ms();
        if now >= next + interval {
            let missed = (now - next) / interval;
            state.lock().iterations_missed += missed as u64;
            tracing::warn!(group = %state.lock().def.name, missed, "rule group evaluation took longer than its interval; skipping evaluations");
            next += missed * interval;
        }
    }
}

#[cfg(test)]
mod tests;
