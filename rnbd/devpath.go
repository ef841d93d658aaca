package rnbd

import "strings"

// ResolveDevPath computes the path the kernel server opens for the dev_name
// of an Open, given its dev_search_path and the session name, with the rules
// of the 6.12 rnbd_server, in order:
//
//  1. len(searchPath)+len(devName) >= PathMax: ErrPathTooLong;
//  2. devName contains ".." anywhere (not only as a path component):
//     ErrPathDotDot;
//  3. if searchPath contains SessNameToken, the path is the text before the
//     first token + "/" + sessName + "/" + devName (anything after the token
//     is discarded); otherwise searchPath + "/" + devName;
//  4. a result of PathMax bytes or more: ErrPathTooLong;
//  5. every run of '/' is collapsed to one.
//
// The kernel reports 1, 2 and 4 as -EINVAL. Inputs containing NUL bytes
// (which C would cut short) wrap ErrOutOfRange. Examples: ("/", "s", "ram0")
// → "/ram0"; ("/run/rnbd-devs/%SESSNAME%", "blya", "sda") →
// "/run/rnbd-devs/blya/sda".
//
// This is a pure string function: it neither resolves symlinks nor checks
// that the result stays inside searchPath (a device name like "/dev/sda" is
// simply appended); that check belongs to the server's export code.
func ResolveDevPath(searchPath, sessName, devName string) (string, error) {
	for _, s := range [...]string{searchPath, sessName, devName} {
		if strings.IndexByte(s, 0) >= 0 {
			return "", wireErr(ErrOutOfRange, "device path", "%q contains NUL", s)
		}
	}
	if len(searchPath)+len(devName) >= PathMax {
		return "", wireErr(ErrPathTooLong, "device path", "dev_search_path (%d bytes) + device name (%d bytes) >= %d",
			len(searchPath), len(devName), PathMax)
	}
	if strings.Contains(devName, "..") {
		return "", wireErr(ErrPathDotDot, "device path", "device name %q", devName)
	}
	var full string
	if i := strings.Index(searchPath, SessNameToken); i >= 0 {
		full = searchPath[:i] + "/" + sessName + "/" + devName
	} else {
		full = searchPath + "/" + devName
	}
	if len(full) >= PathMax {
		return "", wireErr(ErrPathTooLong, "device path", "full path of %d bytes >= %d", len(full), PathMax)
	}
	return collapseSlashes(full), nil
}

// collapseSlashes replaces every run of '/' in p by a single '/'.
func collapseSlashes(p string) string {
	if !strings.Contains(p, "//") {
		return p
	}
	b := make([]byte, 0, len(p))
	for i := 0; i < len(p); i++ {
		if p[i] == '/' && len(b) > 0 && b[len(b)-1] == '/' {
			continue
		}
		b = append(b, p[i])
	}
	return string(b)
}
