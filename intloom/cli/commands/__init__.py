"""One module per group of commands; ``intloom.cli.app`` registers them."""
