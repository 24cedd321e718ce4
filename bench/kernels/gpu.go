//go:build cuda && !cudasim

package main

const simulated = false
