package main

import (
	"fmt"
	"strings"

	"github.com/urfave/cli/v2"
)

// usageExit is the exit status of a command line the command does not
// take, as for most Unix tools (the errno mapping of exitCode leaves 2,
// ENOENT, to errors that have one).
const usageExit = 2

// usageError is a command line that the command does not take: wrong or
// missing arguments, a flag that must be given. It exits with usageExit.
type usageError struct{ msg string }

func (e *usageError) Error() string { return e.msg }

// ExitCode implements cli.ExitCoder.
func (e *usageError) ExitCode() int { return usageExit }

// badUsage returns a usageError for the command of c that ends with a
// pointer to its help.
func badUsage(c *cli.Context, format string, args ...any) error {
	name := commandLine(c)
	return &usageError{fmt.Sprintf("%s: %s\nRun '%s --help' for its usage.", name, fmt.Sprintf(format, args...), name)}
}

// commandLine is the command of c as typed: "urnbd ublk features".
func commandLine(c *cli.Context) string {
	var names []string
	for _, ctx := range c.Lineage() {
		if ctx.Command != nil && ctx.Command.Name != "" && ctx.Command.Name != c.App.Name {
			names = append([]string{ctx.Command.Name}, names...)
		}
	}
	return strings.Join(append([]string{c.App.Name}, names...), " ")
}

// refuseStrayArgs makes every command in cmds (and below) refuse what it
// does not take, instead of going on without it: arguments given to a
// command that takes none (it has no ArgsUsage; a command with one checks
// its own), and a command group run with an unknown command or none.
// A flag it does not know or cannot parse is a usageError too.
func refuseStrayArgs(cmds []*cli.Command) {
	for _, cmd := range cmds {
		refuseStrayArgs(cmd.Subcommands)
		cmd.OnUsageError = flagError
		if cmd.ArgsUsage != "" {
			continue
		}
		if action := cmd.Action; action != nil {
			cmd.Action = func(c *cli.Context) error {
				if c.NArg() > 0 {
					return badUsage(c, "unexpected argument %q (it takes none)", c.Args().First())
				}
				return action(c)
			}
			continue
		}
		if len(cmd.Subcommands) == 0 {
			continue
		}
		names := make([]string, 0, len(cmd.Subcommands))
		for _, sub := range cmd.Subcommands {
			names = append(names, sub.Name)
		}
		cmd.Action = func(c *cli.Context) error {
			if c.NArg() == 0 {
				return badUsage(c, "which one: %s?", strings.Join(names, ", "))
			}
			return badUsage(c, "unknown command %q; it has %s", c.Args().First(), strings.Join(names, ", "))
		}
	}
}

// flagError is the OnUsageError of every command: a flag the command does
// not know, or a value it cannot parse.
func flagError(c *cli.Context, err error, _ bool) error {
	return badUsage(c, "%v", err)
}
