"""How a run meets the machine: memory and time bounds, staged outputs, captured converter logs,
progress, and the checks on the files and names a user hands in."""
