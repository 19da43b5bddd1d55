package main

import "syscall"

var _ = syscall.Getrusage
