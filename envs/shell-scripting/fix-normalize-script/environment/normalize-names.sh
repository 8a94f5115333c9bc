#!/bin/bash
# normalize-names.sh DIR
# Renames the files in DIR to lowercase, with spaces replaced by underscores.

dir=$1

for f in $(ls $dir); do
  new=$(echo $f | tr 'A-Z ' 'a-z_')
  if [ $f != $new ]; then
    mv $dir/$f $dir/$new
  fi
done
