//go:build !race

package main

// raceEnabled tells the tests to build the distlock binary with -race too.
const raceEnabled = false
