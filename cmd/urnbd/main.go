// Command urnbd maps block devices that live on other hosts, over RTRS on
// RDMA or TCP, as local ublk devices, and serves them. See the README.
package main

import (
	"errors"
	"fmt"
	"os"

	"github.com/urfave/cli/v2"
	"golang.org/x/sys/unix"
)

func main() {
	if err := newApp().Run(os.Args); err != nil {
		var usage *usageError
		if errors.As(err, &usage) {
			fmt.Fprintln(os.Stderr, usage) // it names the command
		} else {
			fmt.Fprintf(os.Stderr, "urnbd: %v\n", err)
		}
		os.Exit(exitCode(err))
	}
}

// newApp returns the command line: every command, each refusing what it
// does not take.
func newApp() *cli.App {
	app := &cli.App{
		Name:  "urnbd",
		Usage: "userspace RNBD/RTRS network block device",
		Description: "urnbd exports block devices and files from a server and maps them on clients\n" +
			"as /dev/ublkbN, over RTRS on RDMA (wire-compatible with the kernel's rnbd/rtrs) or TCP.",
		Commands: []*cli.Command{
			serverCommand(),
			mapCommand(),
			unmapCommand(),
			resizeCommand(),
			listCommand(),
			statsCommand(),
			traceCommand(),
			pathCommand(),
			sessionCommand(),
			clientCommand(),
			ublkCommand(),
			keyCommand(),
			versionCommand(),
			gendocsCommand(),
		},
		HideHelpCommand: true,
		Version:         buildInfo().Version,
		OnUsageError:    flagError,
		// main prints the error and exits with exitCode.
		ExitErrHandler: func(*cli.Context, error) {},
	}
	cli.VersionPrinter = func(*cli.Context) { fmt.Print(buildVersion().text()) }
	refuseStrayArgs(app.Commands)
	app.Action = func(c *cli.Context) error {
		if c.NArg() == 0 {
			cli.ShowAppHelpAndExit(c, usageExit)
		}
		return badUsage(c, "unknown command %q", c.Args().First())
	}
	return app
}

// exitCode maps an error to the process exit status: the errno when there is
// one (so scripts can tell EEXIST from ENOENT), else 1.
func exitCode(err error) int {
	var errno unix.Errno
	if errors.As(err, &errno) && errno > 0 && errno < 126 {
		return int(errno)
	}
	var ec cli.ExitCoder
	if errors.As(err, &ec) {
		return ec.ExitCode()
	}
	return 1
}
