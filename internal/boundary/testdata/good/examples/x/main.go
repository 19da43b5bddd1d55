package main

import "example.com/good/arena"

func main() { _ = arena.New }
