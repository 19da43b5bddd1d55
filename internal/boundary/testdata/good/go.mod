module example.com/good

go 1.26.0
