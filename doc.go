// Package distlock is a distributed mutual-exclusion lock over Redis.
package distlock
