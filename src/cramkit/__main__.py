"""`python -m cramkit` (also what `torchrun -m cramkit` runs)."""

from cramkit.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
