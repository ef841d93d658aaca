package main

import (
	"fmt"
	"os"
	"runtime"
	"runtime/debug"
	"strings"

	"github.com/urfave/cli/v2"

	"github.com/urnbd/urnbd/rnbd"
	"github.com/urnbd/urnbd/rtrs"
	"github.com/urnbd/urnbd/ublk"
)

// versionInfo is what `urnbd version` reports.
type versionInfo struct {
	Version    string `json:"version"` // the module version, or "devel"
	Commit     string `json:"commit,omitempty"`
	CommitTime string `json:"commit_time,omitempty"`
	Modified   bool   `json:"modified,omitempty"` // built from a tree with changes not committed
	Go         string `json:"go"`
	RTRS       string `json:"rtrs_protocol"`
	RNBD       string `json:"rnbd_protocol"`
	// UblkKernel are the features this kernel's ublk driver offers; nil
	// (and UblkError says why) when it cannot be asked.
	UblkKernel []string `json:"ublk_kernel_features"`
	UblkError  string   `json:"ublk_error,omitempty"`
	// UblkUsed are the features urnbd asks for on this kernel: the needed
	// ones, and the optional ones the kernel offers.
	UblkUsed     []string `json:"ublk_used_features"`
	UblkOptional []string `json:"ublk_optional_features"`
}

// buildVersion is versionInfo of this binary on this kernel.
func buildVersion() versionInfo {
	v := buildInfo()
	if ctrl, err := ublk.OpenControl(); err != nil {
		v.UblkError = err.Error()
	} else {
		if f, err := ctrl.Features(); err != nil {
			v.UblkError = err.Error()
		} else {
			v.UblkKernel = ublk.FeatureNames(f)
			v.UblkUsed = ublk.FeatureNames(ublk.Wanted(f))
		}
		ctrl.Close()
	}
	return v
}

// releaseVersion and releaseCommit, when set at link time (-X; the
// package build does), name the build where the module's build
// information cannot: a build from a tarball, or with -buildvcs=false.
var releaseVersion, releaseCommit string

// buildInfo is versionInfo without the kernel's part.
func buildInfo() versionInfo {
	v := versionInfo{Version: "devel", Go: runtime.Version(),
		RTRS:         fmt.Sprintf("%d.%d", rtrs.ProtoVerMajor, rtrs.ProtoVerMinor),
		RNBD:         fmt.Sprintf("%d.%d", rnbd.ProtoVerMajor, rnbd.ProtoVerMinor),
		UblkUsed:     ublk.FeatureNames(ublk.UsedFeatures),
		UblkOptional: ublk.FeatureNames(ublk.OptionalFeatures)}
	if bi, ok := debug.ReadBuildInfo(); ok {
		if bi.Main.Version != "" && bi.Main.Version != "(devel)" {
			v.Version = bi.Main.Version
		}
		for _, s := range bi.Settings {
			switch s.Key {
			case "vcs.revision":
				v.Commit = s.Value
			case "vcs.time":
				v.CommitTime = s.Value
			case "vcs.modified":
				v.Modified = s.Value == "true"
			}
		}
	}
	if releaseVersion != "" {
		v.Version = releaseVersion
	}
	if releaseCommit != "" && v.Commit == "" {
		v.Commit = releaseCommit
	}
	return v
}

func (v versionInfo) text() string {
	var b strings.Builder
	fmt.Fprintf(&b, "urnbd %s", v.Version)
	if v.Commit != "" {
		fmt.Fprintf(&b, " (commit %s", v.Commit)
		if v.CommitTime != "" {
			fmt.Fprintf(&b, " %s", v.CommitTime)
		}
		if v.Modified {
			b.WriteString(", modified")
		}
		b.WriteString(")")
	}
	fmt.Fprintf(&b, ", %s\nprotocols: RTRS %s, RNBD %s\n", v.Go, v.RTRS, v.RNBD)
	if v.UblkError != "" {
		fmt.Fprintf(&b, "ublk kernel features: none (%s)\n", v.UblkError)
	} else {
		fmt.Fprintf(&b, "ublk kernel features: %s\n", strings.Join(v.UblkKernel, " "))
	}
	fmt.Fprintf(&b, "ublk features used: %s (optional, where offered: %s)\n",
		strings.Join(v.UblkUsed, " "), strings.Join(v.UblkOptional, " "))
	return b.String()
}

func versionCommand() *cli.Command {
	return &cli.Command{
		Name:  "version",
		Usage: "show the build, the protocol versions, and the ublk features this kernel offers and urnbd uses",
		Flags: formatFlags("text"),
		Action: func(c *cli.Context) error {
			format, err := outputFormat(c, "text")
			if err != nil {
				return err
			}
			v := buildVersion()
			if format == "json" {
				return writeJSON(os.Stdout, v)
			}
			fmt.Print(v.text())
			return nil
		},
	}
}
