//! Resume bookkeeping: which cells `--resume` runs (no record, or a
//! `cancelled` one), and a clean folder for each new attempt (what an
//! unfinished attempt left is moved to `interrupted/<cell>.<n>`, never
//! deleted).

use crate::{check_name, Result, Run, RunState};
use std::path::PathBuf;

impl Run {
    /// Cells that `--resume` must run: no record, or a `cancelled` one.
    pub fn unfinished_cells(&self) -> Result<Vec<String>> {
        let records = self.backend.cell_records(self)?;
        Ok(self
            .plan
            .cells
            .iter()
            .zip(records)
            .filter(|(_, r)| !r.as_ref().is_some_and(|r| r.status.is_finished()))
            .map(|(c, _)| c.id.clone())
            .collect())
    }

    /// Get a clean folder for a new attempt at `cell`; what an earlier,
    /// unfinished attempt left is kept apart (logs are never thrown away).
    /// Returns the folder and the attempt number. An object store answers
    /// [`crate::StoreError::Claimed`] when another process took this attempt.
    pub fn prepare_cell(&self, cell: &str) -> Result<(PathBuf, u32)> {
        check_name("cell id", cell)?;
        self.backend.prepare_cell(self, cell)
    }

    /// Count one more resume and mark the run running again.
    pub fn note_resume(&mut self) -> Result<()> {
        self.meta.resumes += 1;
        self.set_state(RunState::Running)
    }
}

#[cfg(test)]
mod tests {
    use crate::test_support::{env, plan};
    use crate::{CellRecord, CellStatus, RunState, Store, StoreError};
    use chrono::Utc;
    use orch_protocol::{CellResult, Status};

    #[test]
    fn run_lifecycle_and_resume_set() {
        let tmp = tempfile::tempdir().unwrap();
        let store = Store::new(tmp.path());
        let plan = plan();
        let run = store.create_run(&plan, "name: t\n", "local", env()).unwrap();
        assert!(run.plan.cells.iter().all(|c| c.task.run_id == run.id()));
        assert_eq!(run.unfinished_cells().unwrap().len(), 2);

        let cell = &run.plan.cells[0];
        let (dir, attempt) = run.prepare_cell(&cell.id).unwrap();
        assert_eq!(attempt, 1);
        std::fs::write(dir.join("stdout.log"), "first try").unwrap();
        // The first try dies; the second moves its logs aside.
        let (_, attempt) = run.prepare_cell(&cell.id).unwrap();
        assert_eq!(attempt, 2);
        assert!(run
            .dir()
            .join("interrupted")
            .join(format!("{}.1", cell.id))
            .join("stdout.log")
            .exists());

        let now = Utc::now();
        let rec = CellRecord::from_result(
            cell,
            CellResult::new(&cell.id, Status::Succeeded),
            now,
            now,
            attempt,
        );
        run.finish_cell(&rec).unwrap();
        assert_eq!(
            run.unfinished_cells().unwrap(),
            vec![run.plan.cells[1].id.clone()]
        );

        let again = store.open_run("latest").unwrap();
        let record = again.record().unwrap();
        assert_eq!(record.state, RunState::Running);
        assert_eq!(record.counts.get("succeeded"), Some(&1));
        assert_eq!(record.counts.get("pending"), Some(&1));
        let by_prefix = store.open_run(&run.id()[..15]).unwrap();
        assert_eq!(by_prefix.id(), run.id());
        assert!(matches!(
            store.open_run("nope"),
            Err(StoreError::NoSuchRun { .. })
        ));
        assert_eq!(store.list().unwrap().len(), 1);
    }

    #[test]
    fn cancelled_cells_are_run_again() {
        let tmp = tempfile::tempdir().unwrap();
        let store = Store::new(tmp.path());
        let run = store.create_run(&plan(), "", "local", env()).unwrap();
        let now = Utc::now();
        for (c, s) in run.plan.cells.iter().zip([Status::Cancelled, Status::Failed]) {
            run.finish_cell(&CellRecord::from_result(
                c,
                CellResult::new(&c.id, s),
                now,
                now,
                1,
            ))
            .unwrap();
        }
        assert_eq!(
            run.unfinished_cells().unwrap(),
            vec![run.plan.cells[0].id.clone()]
        );
    }

    #[test]
    fn the_agents_own_result_at_the_records_place_is_no_record() {
        // `kill -9` of `orch` after the agent wrote its `result.json` and
        // before the host recorded the cell.
        let tmp = tempfile::tempdir().unwrap();
        let store = Store::new(tmp.path());
        let run = store.create_run(&plan(), "", "local", env()).unwrap();
        let cell = run.plan.cells[0].id.clone();
        let (dir, _) = run.prepare_cell(&cell).unwrap();
        let agents = CellResult::new(&cell, Status::Succeeded);
        std::fs::write(dir.join("result.json"), serde_json::to_vec(&agents).unwrap()).unwrap();
        // A record of another cell, copied in by hand, is no record of this one.
        let other = &run.plan.cells[1];
        let now = Utc::now();
        let (odir, _) = run.prepare_cell(&other.id).unwrap();
        let mut foreign =
            CellRecord::from_result(other, CellResult::new(&other.id, Status::Succeeded), now, now, 1);
        foreign.id = "x.y".into();
        std::fs::write(odir.join("result.json"), serde_json::to_vec(&foreign).unwrap()).unwrap();

        assert_eq!(run.unfinished_cells().unwrap().len(), 2);
        let record = run.record().unwrap();
        assert!(record.cells.iter().all(|c| c.status == CellStatus::Pending));
        let warned = store.take_warnings();
        assert!(
            warned
                .iter()
                .any(|w| w.contains("agent's result") && w.contains(&cell)),
            "{warned:?}"
        );
        assert!(warned.iter().any(|w| w.contains("another cell")), "{warned:?}");
        assert!(run.ledger().unwrap().is_empty());
        // Resumed: the agent's file is kept apart; the new record is the only one.
        let (_, attempt) = run.prepare_cell(&cell).unwrap();
        assert_eq!(attempt, 2);
        let kept = run.dir().join("interrupted").join(format!("{cell}.1"));
        assert!(kept.join(crate::UNRECORDED).is_file());
        run.finish_cell(&CellRecord::from_result(
            &run.plan.cells[0],
            agents,
            now,
            now,
            attempt,
        ))
        .unwrap();
        assert_eq!(run.unfinished_cells().unwrap(), vec![other.id.clone()]);
        assert_eq!(run.ledger().unwrap().len(), 1);
    }
}
