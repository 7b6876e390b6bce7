//go:build race

package distlock

// raceEnabled says the tests run under the race detector.
const raceEnabled = true
