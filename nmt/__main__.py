"""`python -m nmt` (also what `torchrun -m nmt train ...` runs)."""

from nmt.cli import main

if __name__ == "__main__":
    main()
