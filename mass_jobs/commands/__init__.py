"""The `mass` command line: `cli.COMMANDS` maps each command to a module here that declares its flags
(`add_arguments`) and calls one core (`main(args) -> int`); `common` holds the flags and helpers steps
share. Argo containers call exactly these entries, so a command is also a container's contract."""
