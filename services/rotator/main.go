// Command rotator is a placeholder until its issue lands.
package main

func main() {}
