"""`python -m ddpboot` is the `ddpboot` command."""

from ddpboot.cli import main

if __name__ == "__main__":
    main()
