// Command meshctl is a placeholder.
package main

func main() {}
