"""What every run of this package shares, whatever it trains or evaluates: argument validators (`validators`), the
command-line builder (`cli`), the output folder with its lock, checks, step log and checkpoint folders
(`run_folder`, `checkpoint_state`), and the processes' setup and end (`processes`, `host_memory`). Nothing here
imports a model: saved model folders do not carry these modules."""
