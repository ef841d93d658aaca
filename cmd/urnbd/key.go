package main

import (
	"errors"
	"fmt"
	"os"

	"github.com/urfave/cli/v2"
	"golang.org/x/sys/unix"

	"github.com/urnbd/urnbd/internal/keyfile"
	"github.com/urnbd/urnbd/rtrs"
)

// keyCommand makes the keys of RTRS authentication.
func keyCommand() *cli.Command {
	return &cli.Command{
		Name:  "key",
		Usage: "authentication keys: key generate",
		Subcommands: []*cli.Command{{
			Name:      "generate",
			Usage:     "make a key NAME with a 32-byte random secret: a key file line, for the server's --auth-keys file and the client's auth_key= file",
			ArgsUsage: "NAME",
			Flags: []cli.Flag{
				&cli.StringFlag{Name: "out", Usage: "write the key to new `FILE` (mode 0600) instead of standard output"},
			},
			Action: func(c *cli.Context) error {
				if c.NArg() != 1 {
					return badUsage(c, "want one NAME (letters, digits and ._@+-)")
				}
				k, err := rtrs.GenerateKey(c.Args().First())
				if err != nil {
					return fmt.Errorf("key generate: %v: %w", err, unix.EINVAL)
				}
				line := keyfile.Line(k)
				out := c.String("out")
				if out == "" {
					_, err := os.Stdout.WriteString(line)
					return err
				}
				f, err := os.OpenFile(out, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
				if err != nil {
					if errors.Is(err, os.ErrExist) {
						return fmt.Errorf("key generate: %s exists; keys are not overwritten: %w", out, unix.EEXIST)
					}
					return fmt.Errorf("key generate: %w", err)
				}
				if _, err := f.WriteString(line); err != nil {
					f.Close()
					return fmt.Errorf("key generate: %w", err)
				}
				return f.Close()
			},
		}},
	}
}
