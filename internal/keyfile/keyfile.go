// Package keyfile reads the key files of RTRS authentication (rtrs.Key):
// text, one key per line as NAME and SECRET separated by blanks, the
// secret in standard base64 (at least rtrs.MinKeySecret bytes once
// decoded); blank lines and lines starting with # are ignored. A server's
// file lists the keys its clients may prove; a client's holds its one key.
// `urnbd key generate` writes such a line.
//
// A key file must be a regular file that neither its group nor others
// may read or write (mode 0600 or 0400), as ssh demands of private keys.
package keyfile

import (
	"bufio"
	"bytes"
	"encoding/base64"
	"fmt"
	"os"
	"strings"
	"syscall"

	"github.com/urnbd/urnbd/rtrs"
)

// Parse reads keys from text; source names it in errors. Errors wrap
// EINVAL.
func Parse(text []byte, source string) ([]rtrs.Key, error) {
	var keys []rtrs.Key
	sc := bufio.NewScanner(bytes.NewReader(text))
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		f := strings.Fields(line)
		if len(f) != 2 {
			return nil, fmt.Errorf("%s:%d: want NAME SECRET: %w", source, n, syscall.EINVAL)
		}
		secret, err := base64.StdEncoding.DecodeString(f[1])
		if err != nil {
			return nil, fmt.Errorf("%s:%d: key %q: the secret is not base64: %w", source, n, f[0], syscall.EINVAL)
		}
		k := rtrs.Key{Name: f[0], Secret: secret}
		if err := k.Check(); err != nil {
			return nil, fmt.Errorf("%s:%d: %v: %w", source, n, err, syscall.EINVAL)
		}
		keys = append(keys, k)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("%s: %v: %w", source, err, syscall.EINVAL)
	}
	return keys, nil
}

// Read reads the key file at path; it refuses (EPERM) a file that its
// group or others may access.
func Read(path string) ([]rtrs.Key, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("key file: %w", err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("key file: %w", err)
	}
	if !st.Mode().IsRegular() {
		return nil, fmt.Errorf("key file %s: not a regular file: %w", path, syscall.EINVAL)
	}
	if m := st.Mode().Perm(); m&0o077 != 0 {
		return nil, fmt.Errorf("key file %s: mode %04o lets others read or write it; chmod 600 %s: %w", path, m, path, syscall.EPERM)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("key file: %w", err)
	}
	return Parse(b, path)
}

// ReadOne reads a client's key file, which must hold exactly one key.
func ReadOne(path string) (*rtrs.Key, error) {
	keys, err := Read(path)
	if err != nil {
		return nil, err
	}
	if len(keys) != 1 {
		return nil, fmt.Errorf("key file %s: %d keys, a client's holds one: %w", path, len(keys), syscall.EINVAL)
	}
	return &keys[0], nil
}

// Line returns k as a line of a key file, with its newline.
func Line(k rtrs.Key) string {
	return k.Name + " " + base64.StdEncoding.EncodeToString(k.Secret) + "\n"
}
