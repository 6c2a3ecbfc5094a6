"""The filter: the parts and their C layouts, the program plan, the subnet tables and map
values, and the compiler (BCC) that turns a plan into a loaded program."""
