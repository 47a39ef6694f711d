"""`pnmix-fidelity`: the paper's fidelity analyses on a real model."""

from benchmarks.fidelity.analyses import main

raise SystemExit(main())
