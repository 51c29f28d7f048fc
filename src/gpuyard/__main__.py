"""``python -m gpuyard`` runs the CLI."""

from gpuyard.cli.main import main

if __name__ == "__main__":
    main()
