// Package nfttest holds what the tests of pkg/nft and the packages below
// it share: a table of the identity statements with the verdicts packets
// get from it. (A test's network namespace is kerneltest.NetNS's.)
package nfttest
