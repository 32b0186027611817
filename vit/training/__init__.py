"""Floor 5, training: every setting (`settings`), the run's pieces (`build`), the loop (`engine`),
EMA, the schedule, optimizers (Muon), checkpoints and the run's log."""
