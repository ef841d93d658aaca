// Package e2e holds end-to-end tests that combine urnbd's packages as the
// product does (ublk above RTRS), run for real in the lab.
package e2e
