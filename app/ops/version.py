"""The release this code is: bumped by the commit that cuts a release (its
CHANGELOG.md section). ``lockkeeper --version`` and ``lockkeeper_build_info`` also
name the schema revision the code needs, so a build between releases is told
apart by it. Imports nothing: setuptools reads it for the package's version."""

RELEASE = "0.2.0"
