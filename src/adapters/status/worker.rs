//! The thread that works out status answers (searching, sorting and formatting the board), so
//! that no status request ever runs on a thread that evaluates or serves the probes.
//!
//! One thread, at a lower scheduling priority than the rest of the daemon: when the machine is
//! busy the evaluations win, and however many status requests arrive, they take at most one
//! core between them. Its queue is bounded: a request that finds it full is answered "busy"
//! at once instead of waiting behind the others.

use std::sync::mpsc;

use tokio::sync::oneshot;

/// Status answers waiting to be worked out, at most.
pub const QUEUE: usize = 32;

/// How much lower the worker's priority is (its nice value): a tenth of the weight of a
/// normal thread when both want the same core.
const NICENESS: i32 = 10;

type Job = Box<dyn FnOnce() + Send>;

/// The worker's queue was full, or the worker is gone.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the status service is busy; try again in a moment")]
pub struct Busy;

/// A handle on the worker thread; the thread ends when the last handle is dropped.
pub struct StatusWorker {
    jobs: mpsc::SyncSender<Job>,
}

impl StatusWorker {
    /// Starts the thread.
    pub fn start() -> std::io::Result<StatusWorker> {
        let (jobs, queue) = mpsc::sync_channel::<Job>(QUEUE);
        std::thread::Builder::new().name("watermarkd-status".into()).spawn(move || {
            lower_priority();
            while let Ok(job) = queue.recv() {
                job();
            }
        })?;
        Ok(StatusWorker { jobs })
    }

    /// Runs `work` on the worker and waits for its result, or says at once that the worker is
    /// busy.
    pub async fn run<T: Send + 'static>(&self, work: impl FnOnce() -> T + Send + 'static) -> Result<T, Busy> {
        let (done, result) = oneshot::channel();
        let job: Job = Box::new(move || {
            // The asker may have gone (its connection closed): nothing to do then.
            let _ = done.send(work());
        });
        self.jobs.try_send(job).map_err(|_| Busy)?;
        result.await.map_err(|_| Busy)
    }
}

/// Lowers the calling thread's priority. On Linux a nice value belongs to a thread, so this
/// leaves the daemon's other threads as they are. Failing to is not worth stopping for: the
/// thread still serves, it just competes as an equal.
fn lower_priority() {
    // SAFETY: setpriority only changes the scheduling priority of the thread named (0: the
    // calling one); it reads and writes no memory of ours.
    #[expect(unsafe_code, reason = "libc's setpriority has no safe binding")]
    let changed = unsafe { libc::setpriority(libc::PRIO_PROCESS, 0, NICENESS) };
    if changed != 0 {
        tracing::debug!(error = %std::io::Error::last_os_error(), "status worker: cannot lower its priority");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn work_runs_on_another_thread_and_a_full_queue_is_busy_at_once() {
        let worker = StatusWorker::start().unwrap();
        let here = std::thread::current().id();
        let there = worker.run(|| std::thread::current().id()).await.unwrap();
        assert_ne!(here, there);

        // Hold the worker, then fill its queue: one more is refused, not queued.
        let (release, held) = std::sync::mpsc::channel::<()>();
        let (started, running) = std::sync::mpsc::channel::<()>();
        worker
            .jobs
            .try_send(Box::new(move || {
                let _ = started.send(());
                let _ = held.recv();
            }))
            .unwrap();
        running.recv().unwrap();
        let mut queued = Vec::new();
        for i in 0..QUEUE {
            let (done, result) = oneshot::channel();
            worker
                .jobs
                .try_send(Box::new(move || {
                    let _ = done.send(i);
                }))
                .unwrap();
            queued.push(result);
        }
        assert_eq!(worker.run(|| 0).await, Err(Busy));
        release.send(()).unwrap();
        for (i, result) in queued.into_iter().enumerate() {
            assert_eq!(result.await.unwrap(), i);
        }
    }
}
