"""What pygpt keeps on disk and how: atomic writes and folders that change as a whole (atomic,
commit_marker), the writers that keep a full disk an OSError (serializers), the name of every
file (run_files), and checkpoints: saving and loading them (checkpoint), reading older formats
as today's (compat) and checking the --resume state before use (train_state)."""
