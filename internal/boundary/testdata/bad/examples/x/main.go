package main

import "syscall"

func main() { _ = syscall.Getpid }
